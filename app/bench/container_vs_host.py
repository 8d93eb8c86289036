"""`python -m app.bench container-vs-host`: the same training (synthetic data, 2 ranks under mpirun) on this host
and in containers of the stack's image, side by side: median throughput of epochs 2..N, and the ratio.

    python -m app.bench container-vs-host [--epochs 8] [--repeats 3] [--containers compose|run] [--image ...]

Host and containers run in turn, `--repeats` rounds, so each round measures both under the same machine load; a
row gives the median over rounds and the spread (min-max), and the ratio is taken within each round before its
median is taken (as in `peers`): one run on this 2-core machine can be off by a third.

- `--containers compose` (default): `docker compose up` with 2 worker containers, as a user's quick start runs
  it; the ranks talk TCP over the compose bridge, as ranks on different hosts do.
- `--containers run`: one `docker run` of the image with mpirun and both ranks inside: the container's own cost
  alone (same shared-memory transport as on the host).
On the host both ranks exchange gradients through shared memory. Both sides get the stack's Horovod defaults
explicitly, so an image built before a change of defaults is still compared like with like.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from app.bench import ranks as launch
from app.bench.report import median_spread, write_report
from app.entrypoint import TRAINER
from app.horovod_defaults import HOROVOD_DEFAULTS


def median_rate(lines: list[str]) -> tuple[float, float]:
    """(median samples/s over epochs 2..N, last validation accuracy) from a metrics JSON-lines file."""
    records = [json.loads(line) for line in lines if line.strip()]
    rates = [record["samples_per_sec"] for record in records[1:] or records]
    return statistics.median(rates), records[-1]["val_accuracy"]


def trainer_args(dataset: str, epochs: int, metrics: str, scratch: str) -> list[str]:
    return [
        *TRAINER,
        "--dataset",
        dataset,
        "--epochs",
        str(epochs),
        "--metrics-file",
        metrics,
        "--data-dir",
        f"{scratch}/data",
        "--checkpoint-dir",
        f"{scratch}/checkpoints",
    ]


def run_host(args, work: Path) -> list[str]:
    metrics = work / "host.jsonl"
    argv = launch.launcher_argv("hvd-mpi", 2, HOROVOD_DEFAULTS) + trainer_args(
        args.dataset, args.epochs, str(metrics), str(work / "host")
    )
    run(argv, work / "host.log", env=launch.bench_env(HOROVOD_DEFAULTS), cwd=launch.REPO)
    return metrics.read_text().splitlines()


def run_containers_run(args, work: Path) -> list[str]:
    work.chmod(0o777)  # the image's user (uid 1000) writes the metrics here
    variables = [word for name, value in HOROVOD_DEFAULTS.items() for word in ("-x", f"{name}={value}")]
    argv = [
        "docker",
        "run",
        "--rm",
        "--shm-size",
        "1g",
        "--user",
        "mpiuser",  # past the entrypoint, which would make it so (the image starts as root)
        "-v",
        f"{work}:/out",
        "--entrypoint",
        "mpirun",
        args.image,
        "-np",
        "2",
        "-bind-to",
        "none",
        "-map-by",
        "slot",
        *variables,
        *trainer_args(args.dataset, args.epochs, "/out/containers.jsonl", "/tmp"),
    ]
    run(argv, work / "containers.log")
    return (work / "containers.jsonl").read_text().splitlines()


def run_containers_compose(args, work: Path) -> list[str]:
    project = f"hst-bench-{os.getpid()}"
    env = {
        **os.environ,
        "COMPOSE_PROJECT_NAME": project,
        "DATASET": args.dataset,
        "EPOCHS": str(args.epochs),
        "WORKERS": "2",
    }
    try:
        run(["docker", "compose", "up", "--exit-code-from", "launcher"], work / "compose.log", env=env, cwd=launch.REPO)
        return subprocess.run(
            [
                "docker",
                "run",
                "--rm",
                "-v",
                f"{project}_shared:/shared",
                "--entrypoint",
                "cat",
                args.image,
                "/shared/runs/latest/metrics.jsonl",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.splitlines()
    finally:
        subprocess.run(["docker", "compose", "-p", project, "down", "-v"], cwd=launch.REPO, capture_output=True)


def run(argv: list[str], log: Path, **kwargs) -> None:
    with open(log, "w") as out:
        if subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, **kwargs).returncode:
            raise RuntimeError(f"{argv[0]} failed:\n{log.read_text()[-3000:]}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m app.bench container-vs-host", description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--containers", choices=("compose", "run"), default="compose")
    parser.add_argument("--image", default=os.environ.get("IMAGE", "horovod-stack:latest"))
    parser.add_argument("--repeats", type=int, default=3, help="rounds of host then containers")
    parser.add_argument("--short", action="store_true", help="CI: 2 epochs, one round")
    parser.add_argument("--out", default="bench-out")
    args = parser.parse_args(argv)
    if args.short:
        args.epochs, args.repeats = 2, 1
    if shutil.which("docker") is None:
        raise SystemExit("container-vs-host needs docker")
    run_containers = run_containers_run if args.containers == "run" else run_containers_compose
    rounds: list[tuple[tuple[float, float], tuple[float, float]]] = []
    for round_ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="bench-cvh-") as scratch:
            work = Path(scratch)
            host = median_rate(run_host(args, work))
            containers = median_rate(run_containers(args, work))
        rounds.append((host, containers))
        print(
            f"[container-vs-host] round {round_ + 1}/{args.repeats}: host {host[0]:.0f}, containers "
            f"{containers[0]:.0f} samples/s ({containers[0] / host[0]:.2f})",
            flush=True,
        )
    rows = round_rows(rounds, f"containers ({args.containers})")
    columns = [
        ("run", "run", ""),
        ("samples_per_sec", "samples/s", ".0f"),
        ("samples_min", "min", ".0f"),
        ("samples_max", "max", ".0f"),
        ("val_accuracy", "val acc", ".4f"),
        ("ratio_to_host", "/ host", ".2f"),
        ("ratio_min", "min", ".2f"),
        ("ratio_max", "max", ".2f"),
    ]
    title = (
        f"Containers vs host: trainer, {args.dataset}, {args.epochs} epochs, 2 ranks, median samples/s of epochs "
        f"2..N, median of {args.repeats} round(s)"
    )
    write_report(
        args.out,
        "container-vs-host",
        title,
        columns,
        rows,
        draw=lambda fig: draw(fig, rows),
        extra={
            "epochs": args.epochs,
            "dataset": args.dataset,
            "containers": args.containers,
            "image": args.image,
            "repeats": args.repeats,
        },
        notes=["min/max: spread over rounds; / host: the ratio taken within each round, then its median."],
    )
    return {"rows": rows}


def round_rows(rounds: list[tuple[tuple[float, float], tuple[float, float]]], containers_label: str) -> list[dict]:
    """Host and containers rows from each round's ((rate, accuracy) on the host, (rate, accuracy) in containers):
    throughput median/min/max over rounds, the last round's accuracy, the per-round ratio's median/min/max."""
    rows = []
    for index, label in enumerate(("host", containers_label)):
        rates = [pair[index][0] for pair in rounds]
        ratios = [pair[index][0] / pair[0][0] for pair in rounds]
        rate, low, high = median_spread(rates)
        ratio, ratio_low, ratio_high = median_spread(ratios)
        rows.append(
            {
                "run": label,
                "samples_per_sec": rate,
                "samples_min": low,
                "samples_max": high,
                "val_accuracy": rounds[-1][index][1],
                "ratio_to_host": ratio,
                "ratio_min": ratio_low,
                "ratio_max": ratio_high,
            }
        )
    return rows


def draw(figure, rows: list[dict]) -> None:
    axes = figure.add_subplot()
    axes.bar([row["run"] for row in rows], [row["samples_per_sec"] for row in rows])
    axes.set_ylabel("samples/s")
