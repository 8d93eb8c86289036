"""The two gradient-exchange patterns `python -m app.bench ps-vs-ring` measures, both built on the same
point-to-point sends (torch.distributed send/recv, Gloo over TCP), so only the communication pattern differs.

- Parameter server: every worker sends its whole gradient to one server process, which sums them and sends
  the sum back. The server's link carries 2·(N-1)·M bytes per step (N-1 workers): it grows with N.
- Ring-allreduce: the gradient is cut into N chunks; N-1 reduce-scatter steps then N-1 allgather steps pass one
  chunk to the right-hand neighbour. Every link carries 2·(N-1)/N·M bytes: nearly flat in N, no hot spot.

With N ranks both patterns use the same N processes: for the parameter server rank 0 is the server and ranks
1..N-1 the workers.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def ring_allreduce(tensor: torch.Tensor, rank: int, world: int, groups: tuple | None = None) -> None:
    """In-place sum over all ranks: reduce-scatter then allgather around the ring.

    groups: two process groups over all ranks; a message from an even rank travels on the first, from an odd
    rank on the second. With 2 ranks a rank's two neighbours are the same rank, and Gloo moves one pair's two
    directions one after the other; on two groups (two connections) both directions flow at once, as on every
    link of a longer ring."""
    groups = groups or (None, None)
    chunks = list(tensor.chunk(world))
    right, left = (rank + 1) % world, (rank - 1) % world
    incoming = torch.empty_like(chunks[0])

    def pass_right(send_index: int, recv_index: int) -> torch.Tensor:
        """Sends one chunk to the right-hand neighbour while receiving one from the left."""
        request = dist.isend(chunks[send_index].contiguous(), right, group=groups[rank % 2])
        received = incoming[: chunks[recv_index].numel()]
        dist.recv(received, left, group=groups[left % 2])
        assert request is not None  # None only for a rank outside the group
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
            assert request is not None  # None only for a rank outside the group
            request.wait()
        tensor.copy_(total)
    else:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)


def step_timings(pattern: str, rank: int, world: int, numel: int, steps: int, warmup: int = 2) -> list[float]:
    """Seconds per exchange on this rank, after `warmup` untimed ones; the ranks meet at a barrier before each
    step. The process group must be up (torch.distributed, any backend with send/recv). Checks the sum."""
    gradient = torch.empty(numel)
    groups = (dist.group.WORLD, dist.new_group(list(range(world))))

    def exchange(tensor: torch.Tensor, rank: int, world: int) -> None:
        if pattern == "ps":
            parameter_server_exchange(tensor, rank, world)
        else:
            ring_allreduce(tensor, rank, world, groups)

    timings = []
    for step in range(warmup + steps):
        gradient.fill_(float(rank))
        dist.barrier()
        started = time.perf_counter()
        exchange(gradient, rank, world)
        if step >= warmup:
            timings.append(time.perf_counter() - started)
    expected = sum(range(1, world)) if pattern == "ps" else sum(range(world))
    if not bool(torch.all(gradient == expected)):
        raise RuntimeError(f"{pattern}: wrong sum on rank {rank}")
    return timings
