"""The smoke run without a command: the bundled trainer for a short run on the offline digits set, then two checks
on what it wrote: it learned (validation accuracy well above chance, 0.10 for ten digits), and every rank ended with
the same parameters (the trainer's per-rank digests, app/consistency.py). Pure, but for the command's paths."""

from __future__ import annotations

import json
from pathlib import Path

EPOCHS = 3
MIN_ACCURACY = 0.8
"""Well above chance (0.10): 2 ranks reach about 0.9 on digits in 3 epochs."""


def command(folder: Path, epochs: int = EPOCHS) -> list[str]:
    """The trainer's command line; its metrics and summary go to `folder` (a temporary one, not the checkout), and the
    checkout (the working folder) stays off its import path (-P): code under test cannot replace the trainer."""
    return [
        "python", "-P", "-m", "app.train", "--dataset", "digits", "--epochs", str(epochs), "--no-cuda",
        "--progress", "lines", "--metrics-file", str(folder / "metrics.jsonl"),
        "--summary-file", str(folder / "summary.json"),
    ]  # fmt: skip


def read_summary(folder: Path) -> dict | None:
    try:
        return json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def verdict(summary: dict | None, size: int, min_accuracy: float = MIN_ACCURACY) -> tuple[str | None, str]:
    """(why the run fails its checks, or None; what it found) from the trainer's summary.json."""
    if not summary:
        return "the bundled trainer wrote no summary (summary.json)", ""
    ranks = summary.get("ranks") or []
    final = summary.get("final") or {}
    accuracy = final.get("val_accuracy")
    if summary.get("world_size") != size or len(ranks) != size:
        return f"the bundled trainer ran on {summary.get('world_size')} ranks, not {size}", ""
    differing = [entry["rank"] for entry in ranks if entry.get("digest") != ranks[0].get("digest")]
    if differing:
        listed = ", ".join(map(str, differing))
        return f"rank{'s' if len(differing) > 1 else ''} {listed} ended with parameters different from rank 0's", ""
    if not isinstance(accuracy, int | float):
        return "the bundled trainer reported no validation accuracy", ""
    found = (
        f"validation accuracy {accuracy:.3f} after {final.get('epoch', '?')} epochs (chance 0.100), "
        f"parameters identical on all {size} ranks"
    )
    if accuracy < min_accuracy:
        return f"the bundled trainer did not learn: validation accuracy {accuracy:.3f}, below {min_accuracy:.2f}", found
    return None, found
