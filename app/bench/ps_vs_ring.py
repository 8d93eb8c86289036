"""`python -m app.bench ps-vs-ring`: parameter server vs ring-allreduce with one host per rank: each rank in its own
network namespace with its own address and a link limited to --link-mbit in each direction (app.bench.netns),
both patterns on the same point-to-point transport (torch.distributed send/recv over Gloo TCP,
app.bench.allreduce_patterns), beside the cost model's prediction.

    python -m app.bench ps-vs-ring --ranks 2 4 8 --link-mbit 200 --megabytes 8   (root, ip, tc)
    python -m app.bench ps-vs-ring --loopback --ranks 2 4   (no namespaces: every rank on loopback, one host)

Cost model (bandwidth term, B the link rate, M the gradient bytes, N ranks): the server (rank 0) first receives
N-1 gradients through its one link, then sends N-1 sums back: 2(N-1)M/B. The ring's 2(N-1) steps each move
M/N over every link at once, in both directions: 2(N-1)M/(NB). PS / ring = N.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from app.bench import netns
from app.bench import ranks as launch
from app.bench.report import write_report
from app.cost_model import model_seconds

TOLERANCE = 0.15
"""How close the measured PS/ring ratio must land to the model's."""


def model_ratio(ranks: int) -> float:
    return model_seconds("ps", ranks, 1, 1) / model_seconds("ring", ranks, 1, 1)


def within_tolerance(ratio: float, expected: float, tolerance: float = TOLERANCE) -> bool:
    return abs(ratio / expected - 1) <= tolerance


# --- rank side ------------------------------------------------------------------------------------------------
def rank_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--pattern", choices=("ps", "ring"), required=True)
    parser.add_argument("--megabytes", type=float, required=True)
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args(argv)

    import torch

    from app.bench.allreduce_patterns import step_timings

    torch.set_num_threads(1)
    peer = launch.Peer(args.peer)
    timings = step_timings(args.pattern, peer.rank, peer.size, int(args.megabytes * 1e6 / 4), args.steps)
    per_step = [
        max(values) for values in zip(*peer.gather(timings), strict=False)
    ]  # a step ends when the slowest rank is done
    peer.finish(args.result, {"step_s": statistics.median(per_step), "steps_s": per_step})


# --- driver ---------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m app.bench ps-vs-ring", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--link-mbit", type=float, default=200.0, help="each rank's link, each direction")
    parser.add_argument("--megabytes", type=float, default=8.0, help="gradient size (1 MB = 1e6 bytes)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per pattern (after 2 warm-up steps)")
    parser.add_argument("--loopback", action="store_true", help="no namespaces, no shaping: all ranks on loopback")
    parser.add_argument("--short", action="store_true", help="CI: 2 and 3 ranks, 1 MB, 1000 Mbit, 2 steps")
    parser.add_argument("--out", default="bench-out")
    args = parser.parse_args(argv)
    if args.short:
        args.ranks, args.megabytes, args.link_mbit, args.steps = [2, 3], 1.0, 1000.0, 2
    if not args.loopback and (reason := netns.unavailable()):
        raise SystemExit(f"ps-vs-ring {reason}; --loopback runs it without namespaces")

    measured = {}
    if args.loopback:
        for ranks in args.ranks:
            measured[ranks] = measure(ranks, args, None)
    else:
        with netns.Network(max(args.ranks), args.link_mbit) as network:
            for ranks in args.ranks:
                measured[ranks] = measure(ranks, args, network)
    rows = ps_ring_rows(measured, args.megabytes, None if args.loopback else args.link_mbit)
    link = "loopback, one host" if args.loopback else f"{args.link_mbit:g} Mbit/s per rank, one namespace per rank"
    title = f"Parameter server vs ring: {args.megabytes:g} MB gradient, {link}, median of {args.steps} steps"
    columns = [
        ("ranks", "ranks", "d"),
        ("ps_ms", "PS ms", ".1f"),
        ("ring_ms", "ring ms", ".1f"),
        ("ratio", "PS / ring", ".2f"),
        ("model_ratio", "model", ".2f"),
    ]
    if not args.loopback:
        columns[3:3] = [("model_ps_ms", "model PS ms", ".1f"), ("model_ring_ms", "model ring ms", ".1f")]
        columns.append(("within_tolerance", f"within {TOLERANCE:.0%}", ""))
    verdict = (
        ""
        if args.loopback
        else "every ratio within 15% of the model: " + ("yes" if all(row["within_tolerance"] for row in rows) else "NO")
    )
    write_report(
        args.out,
        "ps-vs-ring",
        title,
        columns,
        rows,
        draw=lambda fig: draw(fig, rows),
        extra={
            "link_mbit": None if args.loopback else args.link_mbit,
            "megabytes": args.megabytes,
            "steps": args.steps,
            "tolerance": TOLERANCE,
        },
        notes=[n for n in ("Model: PS 2(N-1)M/B, ring 2(N-1)M/(NB): PS / ring = N (bandwidth term).", verdict) if n],
    )
    return {"rows": rows}


def measure(ranks: int, args, network: netns.Network | None) -> dict[str, list[float]]:
    """Both patterns at one rank count, one job each, back to back."""
    result = {}
    for pattern in ("ps", "ring"):
        options: dict[str, Any] = (
            {}
            if network is None
            else {"rank_prefix": lambda r: network.hosts[r].prefix(), "master_addr": network.hosts[0].address}
        )
        job = launch.run_job(
            "ddp",
            ranks,
            "ps-vs-ring",
            ["--pattern", pattern, "--megabytes", str(args.megabytes), "--steps", str(args.steps)],
            {"GLOO_SOCKET_IFNAME": netns.NIC if network else "lo"},
            **options,
        )
        result[pattern] = job["steps_s"]
        print(f"[ps-vs-ring] {ranks} ranks {pattern:<4} {job['step_s'] * 1e3:8.1f} ms", flush=True)
    return result


def ps_ring_rows(measured: dict[int, dict[str, list[float]]], megabytes: float, link_mbit: float | None) -> list[dict]:
    """One row per rank count: median step times, their ratio, the model (and whether the ratio is within 15%)."""
    rows = []
    for ranks, steps in measured.items():
        ps, ring = statistics.median(steps["ps"]), statistics.median(steps["ring"])
        row = {
            "ranks": ranks,
            "ps_ms": ps * 1e3,
            "ring_ms": ring * 1e3,
            "ratio": ps / ring,
            "model_ratio": model_ratio(ranks),
            "ps_ms_min": min(steps["ps"]) * 1e3,
            "ps_ms_max": max(steps["ps"]) * 1e3,
            "ring_ms_min": min(steps["ring"]) * 1e3,
            "ring_ms_max": max(steps["ring"]) * 1e3,
        }
        if link_mbit:
            row.update(
                model_ps_ms=model_seconds("ps", ranks, megabytes, link_mbit) * 1e3,
                model_ring_ms=model_seconds("ring", ranks, megabytes, link_mbit) * 1e3,
                within_tolerance=within_tolerance(row["ratio"], row["model_ratio"]),
            )
        rows.append(row)
    return rows


def draw(figure, rows: list[dict]) -> None:
    left, right = figure.subplots(1, 2)
    ranks = [row["ranks"] for row in rows]
    left.plot(ranks, [row["ps_ms"] for row in rows], marker="o", label="parameter server")
    left.plot(ranks, [row["ring_ms"] for row in rows], marker="o", label="ring")
    if "model_ps_ms" in rows[0]:
        left.plot(ranks, [row["model_ps_ms"] for row in rows], linestyle="--", label="PS model")
        left.plot(ranks, [row["model_ring_ms"] for row in rows], linestyle="--", label="ring model")
    left.set_xlabel("ranks")
    left.set_ylabel("step ms")
    left.legend(fontsize=8)
    right.plot(ranks, [row["ratio"] for row in rows], marker="o", label="measured")
    right.plot(ranks, [row["model_ratio"] for row in rows], linestyle="--", label="model (N)")
    right.set_xlabel("ranks")
    right.set_ylabel("PS / ring")
    right.legend(fontsize=8)
