"""Checkpoints on disk: written atomically by rank 0, read back for --resume.

The file is written to a temporary name in the same folder, flushed to disk and renamed over
`latest.pt`; a rename within one file system is atomic, so a crash mid-write leaves the previous checkpoint
intact and never a truncated one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

LATEST = "latest.pt"


def save_checkpoint(directory: Path, state: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / LATEST
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=".latest-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
    return target


def load_latest_checkpoint(directory: Path) -> dict[str, Any] | None:
    """The latest checkpoint in `directory`, or None when there is none yet."""
    path = directory / LATEST
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)
