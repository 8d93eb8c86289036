"""The metrics file: one JSON object per line per epoch, written by rank 0.

A resumed run first drops the records of epochs after its checkpoint (a run killed after logging an epoch but
before checkpointing it would otherwise list that epoch twice); a fresh run starts the file empty.
`lr` is the learning rate at the epoch's end, `epochs` the run's planned epochs (files written before they were
recorded lack them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FIELDS = ("epoch", "epochs", "train_loss", "val_loss", "val_accuracy", "samples_per_sec", "world_size", "seconds", "lr")


def keep_epochs_up_to(path: Path, last_epoch: int) -> None:
    """Rewrites `path` (atomically) keeping only the records of epochs <= last_epoch."""
    kept = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip() and json.loads(line).get("epoch", 0) <= last_epoch:
                kept.append(line + "\n")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)


def append_record(path: Path, record: dict[str, Any]) -> None:
    missing = set(FIELDS) - set(record)
    if missing:
        raise ValueError(f"metrics record lacks {sorted(missing)}")
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({field: record[field] for field in FIELDS}) + "\n")


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records in `path`; a last line cut short (the run was killed while writing it) is left out."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                raise ValueError(f"{path}: line {number} is not a JSON record") from None
    return records
