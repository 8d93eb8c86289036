"""Parameter server vs ring-allreduce, measured: one gradient exchange per step, both patterns built on the
same point-to-point sends (torch.distributed, Gloo over TCP), so only the communication pattern differs.

    python -m app.bench.allreduce_patterns [--workers 2 4] [--megabytes 16] [--steps 10]

- Parameter server: every worker sends its whole gradient to one server process, which sums them and sends
  the sum back. The server's link carries 2·N·M bytes per step: it grows with the number of workers N.
- Ring-allreduce: the gradient is cut into N chunks; N-1 reduce-scatter steps then N-1 allgather steps pass one
  chunk to the right-hand neighbour. Every link carries 2·(N-1)/N·M bytes: nearly flat in N, no hot spot.

All processes run on this machine over loopback TCP: the figures show how each pattern scales with N here,
not a network's absolute bandwidth. Each configuration runs in one go, side by side, as the machine is noisy.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def ring_allreduce(tensor: torch.Tensor, rank: int, world: int) -> None:
    """In-place sum over all ranks: reduce-scatter then allgather around the ring."""
    chunks = list(tensor.chunk(world))
    right, left = (rank + 1) % world, (rank - 1) % world
    incoming = torch.empty_like(chunks[0])

    def pass_right(send_index: int, recv_index: int) -> torch.Tensor:
        """Sends one chunk to the right-hand neighbour while receiving one from the left."""
        request = dist.isend(chunks[send_index].contiguous(), right)
        received = incoming[: chunks[recv_index].numel()]
        dist.recv(received, left)
        request.wait()
        return received

    for step in range(world - 1):  # reduce-scatter: after it, rank r holds the full sum of chunk r+1
        recv_index = (rank - step - 1) % world
        chunks[recv_index] += pass_right((rank - step) % world, recv_index)
    for step in range(world - 1):  # allgather: pass the finished chunks around
        recv_index = (rank - step) % world
        chunks[recv_index].copy_(pass_right((rank - step + 1) % world, recv_index))


def parameter_server_exchange(tensor: torch.Tensor, rank: int, world: int) -> None:
    """Rank 0 is the server (no gradient of its own); ranks 1..N push, the server sums and sends the sum back."""
    if rank == 0:
        total = torch.zeros_like(tensor)
        incoming = torch.empty_like(tensor)
        for worker in range(1, world):
            dist.recv(incoming, worker)
            total += incoming
        requests = [dist.isend(total, worker) for worker in range(1, world)]
        for request in requests:
            request.wait()
        tensor.copy_(total)
    else:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)


def run_rank(rank: int, world: int, pattern: str, numel: int, steps: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    gradient = torch.full((numel,), float(rank))
    workers = world - 1 if pattern == "ps" else world
    exchange = parameter_server_exchange if pattern == "ps" else ring_allreduce
    timings = []
    for step in range(steps + 2):  # two warm-up steps
        gradient.fill_(float(rank))
        dist.barrier()
        started = time.perf_counter()
        exchange(gradient, rank, world)
        elapsed = time.perf_counter() - started
        if step >= 2:
            timings.append(elapsed)
    expected = sum(range(1, world)) if pattern == "ps" else sum(range(world))
    assert torch.all(gradient == expected), f"{pattern}: wrong sum on rank {rank}"
    all_timings = [None] * world
    dist.all_gather_object(all_timings, timings)
    if rank == 0:
        # A step ends when the slowest process is done.
        per_step = [max(t[i] for t in all_timings) for i in range(steps)]
        results[(pattern, workers)] = statistics.median(per_step)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def measure(pattern: str, workers: int, numel: int, steps: int, results) -> None:
    world = workers + 1 if pattern == "ps" else workers
    mp.spawn(run_rank, args=(world, pattern, numel, steps, free_port(), results), nprocs=world, join=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--megabytes", type=float, default=16.0, help="gradient size per worker")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    numel = int(args.megabytes * 1e6 / 4)
    results = mp.Manager().dict()
    for workers in args.workers:
        for pattern in ("ps", "ring"):
            measure(pattern, workers, numel, args.steps, results)
    megabytes = numel * 4 / 1e6
    print(f"gradient {megabytes:.1f} MB per worker, median of {args.steps} steps, Gloo over loopback TCP, "
          f"{os.cpu_count()} CPU cores")
    print(f"{'workers':>7} | {'PS step ms':>10} | {'ring step ms':>12} | {'PS / ring':>9} | "
          f"{'PS server MB/step':>17} | {'ring busiest MB/step':>20}")
    for workers in args.workers:
        ps, ring = results[("ps", workers)], results[("ring", workers)]
        print(f"{workers:>7} | {ps * 1e3:>10.1f} | {ring * 1e3:>12.1f} | {ps / ring:>9.2f} | "
              f"{2 * workers * megabytes:>17.1f} | {2 * (workers - 1) / workers * megabytes:>20.1f}")


if __name__ == "__main__":
    main()
