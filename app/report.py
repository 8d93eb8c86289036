"""`python -m app.report RUN_DIR`: a finished or interrupted run at a glance, from the files it left.

Reads RUN_DIR/metrics.jsonl (and summary.json, which only a run that reached its end writes), redraws
RUN_DIR/curves.png and prints one row per epoch and a closing line: how the run ended, its best validation
accuracy and its median throughput.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from app import curves, metrics

COLUMNS = (
    ("epoch", "epoch", "d"),
    ("train loss", "train_loss", ".4f"),
    ("val loss", "val_loss", ".4f"),
    ("val acc", "val_accuracy", ".4f"),
    ("lr", "lr", ".4f"),
    ("samples/s", "samples_per_sec", ".0f"),
    ("seconds", "seconds", ".1f"),
    ("ranks", "world_size", "d"),
)
"""(title, metrics field, format); a field an older metrics file lacks shows as '-'."""


class ReportError(RuntimeError):
    """The folder holds nothing to report; the message names what to pass instead."""


def table(records: list[dict[str, Any]]) -> str:
    widths = [max(len(title), 7) for title, _, _ in COLUMNS]
    lines = ["  ".join(f"{title:>{width}}" for (title, _, _), width in zip(COLUMNS, widths, strict=True))]
    for record in records:
        lines.append(
            "  ".join(
                f"{'-':>{width}}" if record.get(field) is None else f"{record[field]:>{width}{spec}}"
                for (_, field, spec), width in zip(COLUMNS, widths, strict=True)
            )
        )
    return "\n".join(lines)


def closing_line(records: list[dict[str, Any]], summary: dict[str, Any] | None) -> str:
    best = max(records, key=lambda record: record["val_accuracy"])
    ended = "finished" if summary is not None else "interrupted (no summary.json; or still running)"
    return (
        f"{ended}: {len(records)} epoch(s), last epoch {records[-1]['epoch']}, best val accuracy "
        f"{best['val_accuracy']:.4f} (epoch {best['epoch']}), median "
        f"{statistics.median(r['samples_per_sec'] for r in records):.0f} samples/s"
    )


def report(run_dir: Path) -> str:
    """The report's text; redraws run_dir/curves.png on the way."""
    metrics_file = run_dir / "metrics.jsonl"
    if not metrics_file.is_file():
        raise ReportError(
            f"{run_dir} holds no metrics.jsonl: pass the folder a run wrote to (its --run-dir, or "
            "the folder of its --metrics-file)"
        )
    try:
        records = metrics.read_records(metrics_file)
    except ValueError as error:
        raise ReportError(str(error)) from None
    if not records:
        raise ReportError(f"{metrics_file} has no epoch yet: report again once the run has finished an epoch")
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text(encoding="utf-8")) if summary_file.is_file() else None
    picture = curves.draw(records, run_dir / "curves.png")
    return f"{table(records)}\n{closing_line(records, summary)}\ncurves: {picture}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.report", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the folder a run wrote (--run-dir)")
    args = parser.parse_args(argv)
    try:
        print(report(args.run_dir))
    except ReportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
