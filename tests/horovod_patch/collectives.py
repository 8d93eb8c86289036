"""Run under horovodrun or mpirun with 2 ranks: the collectives the stack's Horovod patch touches, checked for
their results, then an idle second with the background thread's cycles marked in a timeline.

    collectives.py RESULT_DIR
Rank 0 writes RESULT_DIR/result.json: {"ok": true} and the timeline file's path.
"""

import json
import sys
import time
from pathlib import Path

import horovod.torch as hvd
import torch

hvd.init()
rank, size = hvd.rank(), hvd.size()
out = Path(sys.argv[1])

# A rank that arrives late: the other one waits inside the negotiation, not in a lost cycle.
if rank == 1:
    time.sleep(0.3)
assert hvd.allreduce(torch.ones(4), op=hvd.Sum, name="late").tolist() == [size] * 4

# Quiet for longer than the idle wait (50 ms), then a burst of async ops synchronised out of order.
time.sleep(0.2)
handles = [hvd.allreduce_async(torch.full((3,), float(i + rank)), op=hvd.Sum, name=f"burst.{i}") for i in range(8)]
for i, handle in reversed(list(enumerate(handles))):
    assert hvd.synchronize(handle).tolist() == [float(2 * i + 1)] * 3

# Uneven work, then join: the joined rank keeps serving the other's allreduces (as zeros).
for step in range(2 + 3 * rank):
    value = hvd.allreduce(torch.ones(2), op=hvd.Sum, name=f"uneven.{step}")
    assert value.tolist() == ([2.0, 2.0] if step < 2 else [1.0, 1.0]), (rank, step, value)
hvd.join()

# An idle second, its cycles marked in the timeline.
timeline = out / "timeline.json"
hvd.start_timeline(str(timeline), mark_cycles=True)
time.sleep(1.0)
hvd.stop_timeline()
hvd.allreduce(torch.ones(1), name="after")
if rank == 0:
    (out / "result.json").write_text(json.dumps({"ok": True, "timeline": str(timeline)}))
hvd.shutdown()
