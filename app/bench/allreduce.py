"""`python -m app.bench allreduce`: one allreduce of a float32 tensor, 4 KB to 256 MB, timed on each peer:
Horovod over MPI and over Gloo (with the stack's defaults), and torch.distributed.all_reduce over Gloo.

    python -m app.bench allreduce [--ranks 2] [--sizes 4K 64K 1M 16M 256M] [--out bench-out]
    python -m app.bench allreduce --images horovod-stack:latest horovod-stack:tensorflow   (each image's Horovod)

In an environment without torch (the TensorFlow image), the Horovod peers allreduce TensorFlow tensors through
horovod.tensorflow, and torch's peer is left out. `--images` runs the bench in a container of each image (the
image's own code, MPI and Gloo peers) and prints their columns side by side: the same Horovod built against each
framework.

Reported per size, as nccl-tests does: time (the slowest rank's, median over iterations), algorithm bandwidth
algbw = bytes / time, and bus bandwidth busbw = algbw x 2(n-1)/n: the rate each link carries in a ring, so
figures for different rank counts compare with each other and with the link's own speed.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from app.bench import ranks as launch
from app.bench.report import slowest_rank_median, write_report
from app.horovod_defaults import HOROVOD_DEFAULTS

DEFAULT_SIZES = ["4K", "16K", "64K", "256K", "1M", "4M", "16M", "64M", "256M"]
PEERS = {"hvd-mpi": "Horovod MPI", "hvd-gloo": "Horovod Gloo", "ddp": "torch Gloo"}
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}
NOTE = "busbw = algbw x 2(n-1)/n; GB = 1e9 bytes. Horovod runs with the stack's defaults."


def parse_size(text: str) -> int:
    """'4K' -> 4096, '256M' -> 268435456, '100' -> 100 (bytes)."""
    text = text.strip().upper().removesuffix("B")
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


def size_label(size: int) -> str:
    for unit in ("G", "M", "K"):
        if size >= UNITS[unit] and size % UNITS[unit] == 0:
            return f"{size // UNITS[unit]} {unit}B"
    return f"{size} B"


def bus_bandwidth(algbw: float, ranks: int) -> float:
    """busbw = algbw x 2(n-1)/n: what each link of a ring carries for an allreduce of that algbw."""
    return algbw * 2 * (ranks - 1) / ranks


def iterations_for(size: int, short: bool) -> int:
    """Enough iterations for a stable median, fewer for big tensors (about 1 GB moved per size, 3 to 50)."""
    if short:
        return 2
    return max(3, min(50, (1 << 30) // size))


# --- rank side ------------------------------------------------------------------------------------------------
def rank_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--sizes", nargs="+", type=int, required=True)
    parser.add_argument("--short", action="store_true")
    args = parser.parse_args(argv)
    if not has_torch():
        tensorflow_rank_main(args)
        return

    import torch

    torch.set_num_threads(1)
    peer = launch.Peer(args.peer)
    if args.peer == "ddp":
        import torch.distributed as dist

        def allreduce(tensor, name):
            dist.all_reduce(tensor)
    else:
        import horovod.torch as hvd

        def allreduce(tensor, name):
            hvd.allreduce_(tensor, op=hvd.Sum, name=name)

    seconds = []
    for size in args.sizes:
        tensor = torch.empty(size // 4)
        call = functools.partial(allreduce, tensor, f"allreduce.{size}")
        timings, _ = timed_calls(call, size, args.short, reset=functools.partial(tensor.fill_, 1.0))
        if not bool((tensor == peer.size).all()):
            raise RuntimeError(f"{args.peer}: wrong allreduce sum for {size} bytes")
        seconds.append(slowest_rank_median(peer.gather(timings)))
        del tensor, call  # the partial holds the tensor too
    peer.finish(args.result, {"sizes": args.sizes, "seconds": seconds})


def tensorflow_rank_main(args: argparse.Namespace) -> None:
    """The Horovod peers' rank side with TensorFlow tensors (horovod.tensorflow), where torch is not installed."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from app import shared_values

    tf.config.set_visible_devices([], "GPU")
    tf.config.threading.set_intra_op_parallelism_threads(1)
    hvd.init()
    seconds = []
    for size in args.sizes:
        call = functools.partial(hvd.allreduce, tf.ones(size // 4), op=hvd.Sum, name=f"allreduce.{size}")
        timings, total = timed_calls(call, size, args.short)
        if not bool(tf.reduce_all(total == hvd.size())):
            raise RuntimeError(f"{args.peer}: wrong allreduce sum for {size} bytes")
        gathered = shared_values.allgather(
            timings, lambda array, name: hvd.allgather(tf.constant(array), name=name).numpy(), f"timings.{size}"
        )
        seconds.append(slowest_rank_median(gathered))
    if hvd.rank() == 0:
        Path(args.result).write_text(json.dumps({"sizes": args.sizes, "seconds": seconds}))
    hvd.shutdown()


def timed_calls(
    call: Callable[[], object], size: int, short: bool, reset: Callable[[], object] | None = None
) -> tuple[list[float], object]:
    """`call`'s seconds, each after `reset` (not timed), over iterations_for(size) calls after two warm-up calls;
    and what the last call returned."""
    timings, result = [], None
    for index in range(2 + iterations_for(size, short)):
        if reset is not None:
            reset()
        started = time.perf_counter()
        result = call()
        if index >= 2:
            timings.append(time.perf_counter() - started)
    return timings, result


def has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


# --- driver ---------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m app.bench allreduce", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES, help="bytes, K/M/G suffixes (powers of 2)")
    parser.add_argument("--peers", nargs="+", choices=PEERS, help="default: every peer this environment has")
    parser.add_argument("--images", nargs="+", help="run in a container of each image, Horovod's peers side by side")
    parser.add_argument("--short", action="store_true", help="CI: two small sizes, two iterations")
    parser.add_argument("--out", default="bench-out")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in (["4K", "64K"] if args.short else args.sizes)]
    if args.images:
        return compare_images(args, sizes)
    args.peers = args.peers or [peer for peer in PEERS if peer != "ddp" or has_torch()]
    env = dict(HOROVOD_DEFAULTS)
    measured = {}
    for peer in args.peers:
        job = launch.run_job(
            peer,
            args.ranks,
            "allreduce",
            ["--sizes", *map(str, sizes)] + (["--short"] if args.short else []),
            env if peer != "ddp" else {},
        )
        measured[peer] = job["seconds"]
        print(f"[allreduce] {PEERS[peer]} done", flush=True)
    rows = allreduce_rows(sizes, measured, args.ranks)
    columns = [("size", "size", "")]
    for peer in args.peers:
        columns += [
            (f"{peer}_us", f"{PEERS[peer]} us", ".0f"),
            (f"{peer}_algbw", "algbw GB/s", ".3f"),
            (f"{peer}_busbw", "busbw GB/s", ".3f"),
        ]
    title = f"allreduce, float32 sum, {args.ranks} ranks on one host (1 thread each), median time of the slowest rank"
    write_report(
        args.out,
        "allreduce",
        title,
        columns,
        rows,
        draw=lambda fig: draw(fig, rows, args.peers),
        extra={"ranks": args.ranks, "horovod_env": env},
        notes=[NOTE],
    )
    return {"rows": rows}


def compare_images(args: argparse.Namespace, sizes: list[int]) -> dict:
    """The bench's Horovod peers in a container of each image, one after the other; their columns side by side."""
    peers = [peer for peer in (args.peers or PEERS) if peer != "ddp"]
    measured: dict[str, list[float]] = {}
    labels: dict[str, str] = {}
    for image in args.images:
        # The table goes to stderr, the rows' JSON alone to stdout: nothing is mounted or left behind.
        command = ["python", "-m", "app.bench", "allreduce", "--ranks", str(args.ranks), "--peers", *peers,
                   "--sizes", *map(str, sizes), "--out", "/tmp/out"] + (["--short"] if args.short else [])  # fmt: skip
        script = f"{shlex.join(command)} >&2 && cat /tmp/out/allreduce.json"
        done = subprocess.run(["docker", "run", "--rm", "--shm-size", "1g", image, "bash", "-c", script],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode:
            raise SystemExit(f"allreduce in {image} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        rows = json.loads(done.stdout)["rows"]
        for peer in peers:
            key = f"{image}|{peer}"
            measured[key] = [row[f"{peer}_us"] / 1e6 for row in rows]
            labels[key] = f"{image.rsplit(':', 1)[-1]} {PEERS[peer]}"
        print(f"[allreduce] {image} done", flush=True)
    rows = allreduce_rows(sizes, measured, args.ranks)
    columns = [("size", "size", "")]
    for key, label in labels.items():
        columns += [(f"{key}_us", f"{label} us", ".0f"), (f"{key}_busbw", "busbw GB/s", ".3f")]
    title = f"allreduce in each image, float32 sum, {args.ranks} ranks (1 thread each), median of the slowest rank"
    write_report(args.out, "allreduce-images", title, columns, rows, extra={"images": args.images}, notes=[NOTE])
    return {"rows": rows}


def allreduce_rows(sizes: list[int], measured: dict[str, list[float]], ranks: int) -> list[dict]:
    rows = []
    for index, size in enumerate(sizes):
        row = {"size": size_label(size), "bytes": size}
        for peer, seconds in measured.items():
            algbw = size / seconds[index] / 1e9
            row.update(
                {
                    f"{peer}_us": seconds[index] * 1e6,
                    f"{peer}_algbw": algbw,
                    f"{peer}_busbw": bus_bandwidth(algbw, ranks),
                }
            )
        rows.append(row)
    return rows


def draw(figure, rows: list[dict], peers: list[str]) -> None:
    left, right = figure.subplots(1, 2)
    sizes = [row["bytes"] for row in rows]
    for peer in peers:
        left.plot(sizes, [row[f"{peer}_us"] for row in rows], marker="o", label=PEERS[peer])
        right.plot(sizes, [row[f"{peer}_busbw"] for row in rows], marker="o", label=PEERS[peer])
    for axes, label in ((left, "time (us)"), (right, "bus bandwidth (GB/s)")):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("bytes")
        axes.set_ylabel(label)
        axes.legend(fontsize=8)
    left.set_yscale("log")
