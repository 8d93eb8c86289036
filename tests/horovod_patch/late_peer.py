"""Rank 1 reaches Horovod's Gloo rendezvous LATE seconds after rank 0 (a joining worker whose Python and torch are
still starting), then both allreduce once. Prints one line per rank."""

import os
import sys
import time

late = float(sys.argv[1])
if os.environ.get("HOROVOD_RANK") == "1":
    time.sleep(late)

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402

hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
print(f"rank {hvd.rank()} of {hvd.size()}: rendezvous ok, allreduce sum {total:g}", flush=True)
