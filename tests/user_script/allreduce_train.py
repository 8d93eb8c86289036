"""A user's own Horovod script, as people bring to the stack: horovod.torch and torch only, nothing of app.*.

    python allreduce_train.py [--steps N] [--exit-status N] [--fail-on-rank R]

Allreduces a tensor and checks the sum on every rank, trains a small model a few steps with Horovod's
DistributedOptimizer, prints rank, size and host, and exits with the status it is told to (or raises on the
rank it is told to, to show how a failing rank ends a job).
"""

import argparse
import socket
import sys

import horovod.torch as hvd
import torch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--exit-status", type=int, default=0)
    parser.add_argument("--fail-on-rank", type=int, default=-1)
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(0)
    rank, size = hvd.rank(), hvd.size()

    total = hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum, name="rank_sum").item()
    expected = size * (size + 1) / 2
    if total != expected:
        raise SystemExit(f"rank {rank}: allreduce gave {total}, expected {expected}")

    if rank == args.fail_on_rank:
        raise RuntimeError(f"user script failed on purpose on rank {rank}")

    model = torch.nn.Linear(8, 1)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    generator = torch.Generator().manual_seed(rank)
    weights = torch.arange(8, dtype=torch.float32).unsqueeze(1) / 8
    losses = []
    for _ in range(args.steps):
        features = torch.randn(32, 8, generator=generator)
        loss = torch.nn.functional.mse_loss(model(features), features @ weights)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    print(
        f"user-script rank {rank} of {size} on {socket.gethostname()} ({hvd.cross_size()} hosts, "
        f"{hvd.local_size()} rank(s) on this one): allreduce "
        f"sum {total:.0f} ok, "
        f"loss {losses[0]:.4f} -> {losses[-1]:.4f}",
        flush=True,
    )
    return args.exit_status


if __name__ == "__main__":
    sys.exit(main())
