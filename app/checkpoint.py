"""Checkpoints on disk: written atomically by rank 0, read back for --resume.

The file is written to a temporary name in the same folder, flushed to disk and renamed over
`latest.pt`; a rename within one file system is atomic, so a crash mid-write leaves the previous checkpoint
intact and never a truncated one.

Reading one back unpickles with `weights_only=True`: only tensors, numbers, strings and plain containers are
rebuilt, so a `latest.pt` planted in a shared folder cannot run code on rank 0. The trainer's own checkpoints
(epoch, dataset name, model and SGD state dicts) are exactly such values; anything else is refused whole.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import torch

LATEST = "latest.pt"


class CheckpointError(RuntimeError):
    """A checkpoint file that exists but is not loaded; the message is one line naming the file and the fix."""


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
    """The latest checkpoint in `directory`, or None when there is none yet.

    Raises CheckpointError for a file that holds anything but tensors and plain values (nothing in it is run)
    or that cannot be read as a checkpoint at all."""
    path = directory / LATEST
    if not path.exists():
        return None
    fix = "move it away, or pass a --checkpoint-dir this trainer wrote"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"refusing checkpoint {path}: it holds more than tensors and plain values "
            f"({unpickling_reason(str(error))}); nothing in it was run: {fix}"
        ) from None
    except (RuntimeError, EOFError, OSError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CheckpointError(f"cannot read checkpoint {path} ({reason}): {fix}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"refusing checkpoint {path}: it holds a {type(state).__name__}, not a dict: {fix}")
    return state


def unpickling_reason(message: str) -> str:
    """The line of torch's weights-only refusal that names what was refused (its other lines are advice)."""
    advice = ("Weights only load failed", "Please file an issue", "Check the documentation")
    lines = [line.strip() for line in message.splitlines()]
    reasons = [line for line in lines if line and not line.startswith(advice)]
    return reasons[0].rstrip(".") if reasons else "not a weights-only file"
