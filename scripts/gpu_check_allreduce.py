"""One rank of scripts/gpu-check.sh's allreduce check: Horovod's allreduce (sum and average), broadcast and
allgather on known values, the time of a large allreduce, and which of Horovod's operations really ran.

Start it under a Horovod launcher, e.g.

    horovodrun -np 2 -H localhost:2 --gloo python scripts/gpu_check_allreduce.py --device cpu --expect GLOO
    horovodrun -np 1 -H localhost:1 --gloo python scripts/gpu_check_allreduce.py --device cuda --expect NCCL

Rank r contributes (r + 1) * pattern, pattern = small integers (never zeros), so the sum over N ranks is
exactly N (N + 1) / 2 * pattern in float32, and every element is checked. With --expect OPS, rank 0 turns on
Horovod's timeline (HOROVOD_TIMELINE) and requires an OPS_ALLREDUCE activity in it (NCCL_ALLREDUCE, GLOO_ALLREDUCE
or MPI_ALLREDUCE): that is what Horovod itself ran, not what it was built with. With --device cuda every rank
uses its own GPU (the local rank's): NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so the number
of ranks there is at most the number of GPUs.

Rank 0 prints the figures and one line 'allreduce-check: PASS ...' or 'allreduce-check: FAIL ...', and writes them
as JSON to --json; the exit status is 0 only on PASS.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--expect", choices=("NCCL", "GLOO", "MPI"), help="the allreduce Horovod must have run")
    parser.add_argument("--sizes", default="1000,1048576,16777216", help="float32 elements per tensor, comma-separated")
    parser.add_argument("--iters", type=int, default=20, help="timed allreduces of the largest size")
    parser.add_argument("--json", help="rank 0 writes its result here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    timeline = None
    if args.expect:
        # Only the coordinator (rank 0) opens this file; every rank must have the variable to record activities.
        timeline = Path(os.environ.get("GPU_CHECK_TIMELINE") or Path(tempfile.gettempdir()) / "gpu-check-timeline.json")
        os.environ["HOROVOD_TIMELINE"] = str(timeline)

    import horovod.torch as hvd
    import torch

    hvd.init()
    rank, size, local_rank, local_size = hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()
    if args.device == "cuda":
        if not torch.cuda.is_available():
            return finish(hvd, rank, args, timeline, [f"rank {rank}: torch sees no GPU"], {})
        gpus = torch.cuda.device_count()
        if local_size > gpus:
            return finish(
                hvd,
                rank,
                args,
                timeline,
                [f"{local_size} ranks on this host but {gpus} GPU(s): NCCL needs one GPU per rank"],
                {},
            )
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    problems: list[str] = []
    figures: dict = {
        "ranks": size,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "nccl_built": bool(hvd.nccl_built()),
        "gloo_built": bool(hvd.gloo_built()),
        "mpi_built": bool(hvd.mpi_built()),
        "nccl_version": nccl_version(torch),
    }
    sizes = [int(text) for text in args.sizes.split(",") if text]
    total = size * (size + 1) // 2
    for n in sizes:
        pattern = (torch.arange(n, device=device) % 97 + 1).float()  # 1..97, never zero, exact in float32
        mine = pattern * (rank + 1)
        summed = hvd.allreduce(mine.clone(), op=hvd.Sum, name=f"sum.{n}")
        averaged = hvd.allreduce(mine.clone(), op=hvd.Average, name=f"avg.{n}")
        sync()
        if summed.device != device:
            problems.append(f"sum of {n}: result on {summed.device}, not {device}")
        if not torch.equal(summed, pattern * total):
            wrong = int((summed != pattern * total).sum())
            problems.append(f"sum of {n} floats: {wrong} element(s) wrong (expected {total} x pattern)")
        if not torch.allclose(averaged, pattern * (total / size), rtol=1e-6, atol=0):
            problems.append(f"average of {n} floats: wrong (expected {total / size} x pattern)")
    value = torch.full((4,), float(rank + 1) * 10, device=device)
    broadcast = hvd.broadcast(value, root_rank=0, name="bcast")
    gathered = hvd.allgather(torch.full((2,), float(rank), device=device), name="gather")
    sync()
    if not torch.equal(broadcast, torch.full((4,), 10.0, device=device)):
        problems.append("broadcast from rank 0: wrong values")
    expected_gather = torch.arange(size, device=device, dtype=torch.float32).repeat_interleave(2)
    if not torch.equal(gathered, expected_gather):
        problems.append("allgather: wrong values")

    # Time of the largest allreduce (after warm-up); bus bandwidth as nccl-tests counts it, 2 (N - 1) / N.
    n = max(sizes)
    tensor = torch.ones(n, device=device, dtype=torch.float32)
    for _ in range(3):
        hvd.allreduce(tensor, op=hvd.Sum, name="timed")
    sync()
    times = []
    for _ in range(args.iters):
        started = time.perf_counter()
        hvd.allreduce(tensor, op=hvd.Sum, name="timed")
        sync()
        times.append(time.perf_counter() - started)
    seconds = statistics.median(times)
    megabytes = n * 4 / 1e6
    figures.update(
        largest_mb=megabytes,
        allreduce_ms=seconds * 1e3,
        algbw_gb_s=megabytes / 1e3 / seconds,
        busbw_gb_s=(megabytes / 1e3 / seconds) * 2 * (size - 1) / size,
    )
    every = hvd.allgather_object(problems)
    problems = [problem for rank_problems in every for problem in rank_problems]
    return finish(hvd, rank, args, timeline, problems, figures)


def nccl_version(torch) -> str | None:
    """The NCCL that torch loaded (the one Horovod's NCCL ops use too)."""
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:
        return None


def finish(hvd, rank: int, args, timeline: Path | None, problems: list[str], figures: dict) -> int:
    hvd.shutdown()  # flushes the timeline
    if rank != 0:
        return 1 if problems else 0
    ops_seen: list[str] = []
    if timeline is not None:
        text = timeline.read_text(errors="replace") if timeline.exists() else ""
        ops_seen = sorted(op for op in ("NCCL_ALLREDUCE", "GLOO_ALLREDUCE", "MPI_ALLREDUCE") if op in text)
        if f"{args.expect}_ALLREDUCE" not in ops_seen:
            problems.append(
                f"Horovod's timeline shows {', '.join(ops_seen) or 'no allreduce'}, not {args.expect}_ALLREDUCE"
            )
    figures["ops_seen"] = ops_seen
    verdict = "FAIL" if problems else "PASS"
    for key, value in figures.items():
        print(f"allreduce-check: {key} = {round(value, 3) if isinstance(value, float) else value}")
    checked = (
        f"{figures.get('ranks', '?')} rank(s), {args.device} tensors, sizes {args.sizes}, sum/average/broadcast/"
        f"allgather, ops seen {','.join(ops_seen) or '-'}"
    )
    if "allreduce_ms" in figures:
        checked += f"; {figures['largest_mb']:.3g} MB allreduce {figures['allreduce_ms']:.2f} ms, "
        checked += (
            f"busbw {figures['busbw_gb_s']:.1f} GB/s"
            if figures["ranks"] > 1
            else f"algbw {figures['algbw_gb_s']:.1f} GB/s (1 rank: a local copy, nothing sent)"
        )
    print(f"allreduce-check: {verdict} {checked}" + "".join(f"\n  problem: {p}" for p in problems), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"verdict": verdict, "problems": problems, **figures}, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
