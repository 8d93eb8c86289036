"""A user's script for the smoke role's tests: each rank says whether it runs over Gloo (hvd.gloo_enabled()), whether
it sees CUDA, which uid it runs as and with which capabilities (CapEff, NoNewPrivs from /proc/self/status),
allreduces, writes a file of its own in the current folder (the checkout, to
check who owns what the run leaves), and raises on the rank it is told to while the others wait for it in a
second allreduce.

    python smoke_probe.py [--fail-on-rank R]
"""

import argparse
import os
from pathlib import Path

import horovod.torch as hvd
import torch


def privileges() -> str:
    """This process's effective capabilities and no_new_privs flag, as the kernel reports them."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return f"CapEff={status['CapEff'].strip()} NoNewPrivs={status['NoNewPrivs'].strip()}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-on-rank", type=int, default=-1)
    args = parser.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    print(
        f"probe rank {rank} of {size}: gloo_enabled={hvd.gloo_enabled()} mpi_enabled={hvd.mpi_enabled()} "
        f"cuda_available={torch.cuda.is_available()} uid={os.getuid()} {privileges()}",
        flush=True,
    )
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
