"""A user's script for the smoke role's tests: each rank says whether it runs over Gloo (hvd.gloo_enabled()), whether
it sees CUDA and which uid it runs as, allreduces, writes a file of its own in the current folder (the checkout, to
check who owns what the run leaves), and raises on the rank it is told to while the others wait for it in a
second allreduce.

    python smoke_probe.py [--fail-on-rank R]
"""

import argparse
import os
from pathlib import Path

import horovod.torch as hvd
import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-on-rank", type=int, default=-1)
    args = parser.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    print(f"probe rank {rank} of {size}: gloo_enabled={hvd.gloo_enabled()} mpi_enabled={hvd.mpi_enabled()} "
          f"cuda_available={torch.cuda.is_available()} uid={os.getuid()}", flush=True)
    total = hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum, name="probe_sum").item()
    assert total == size * (size + 1) / 2, total
    out = Path("probe-output") / f"rank-{rank}.txt"
    out.parent.mkdir(exist_ok=True)
    out.write_text(f"rank {rank}: sum {total:.0f}\n")
    if rank == args.fail_on_rank:
        raise RuntimeError(f"probe failed on purpose on rank {rank}")
    hvd.allreduce(torch.ones(1), name="probe_done")


if __name__ == "__main__":
    main()
