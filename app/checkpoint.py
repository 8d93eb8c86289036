"""Checkpoints on disk: written atomically by rank 0, read back for --resume; PyTorch's and TensorFlow's.

The file is written to a temporary name in the same folder, flushed to disk and renamed over
`latest.pt` (PyTorch) or `latest.npz` (TensorFlow); a rename within one file system is atomic, so a crash mid-write
leaves the previous checkpoint intact and never a truncated one.

Nothing read back can run code on rank 0, so a checkpoint planted in a shared folder is harmless. PyTorch's
unpickles with `weights_only=True`: only tensors, numbers, strings and plain containers are rebuilt; the trainer's
own checkpoints (epoch, dataset name, model and SGD state dicts) are exactly such values; anything else is refused
whole. TensorFlow's is a NumPy archive read without pickle: the model's and the optimizer's variables as arrays, in
their order, and the epoch and dataset as JSON text.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

from app import frameworks

LATEST = "latest.pt"
KERAS_LATEST = "latest.npz"


class CheckpointError(RuntimeError):
    """A checkpoint file that exists but is not loaded; the message is one line naming the file and the fix."""


def refuse_the_other_frameworks(directory: Path, wanted: frameworks.Framework) -> None:
    """Raises CheckpointError where `directory` holds no checkpoint of `wanted`'s but one of another framework's."""
    for other, name in ((frameworks.PYTORCH, LATEST), (frameworks.TENSORFLOW, KERAS_LATEST)):
        if other is not wanted and (directory / name).exists():
            raise CheckpointError(
                f"{directory} holds a {other.name} checkpoint ({name}), not {wanted.name}'s: resume it on "
                f"{other.image}, or pass another --checkpoint-dir"
            )


def save_checkpoint(directory: Path, state: dict[str, Any]) -> Path:
    import torch  # this module is also the TensorFlow trainer's (write_atomically), where torch is absent

    return write_atomically(directory / LATEST, lambda handle: torch.save(state, handle))


def write_atomically(target: Path, write: Callable[[IO[bytes]], None]) -> Path:
    """`write` fills a temporary file beside `target`, which then replaces `target` in one rename."""
    directory = target.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{target.stem}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
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
        refuse_the_other_frameworks(directory, frameworks.PYTORCH)
        return None
    fix = "move it away, or pass a --checkpoint-dir this trainer wrote"
    import torch

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


def save_arrays(directory: Path, meta: dict[str, Any], arrays: dict[str, list[np.ndarray]]) -> Path:
    """TensorFlow's checkpoint: `meta` (JSON values) and, per group (model, optimizer), its variables in order."""
    named = {f"{group}/{index}": value for group, values in arrays.items() for index, value in enumerate(values)}
    named["meta"] = np.array(json.dumps(meta))
    return write_atomically(directory / KERAS_LATEST, lambda handle: np.savez(handle, **named))  # type: ignore[arg-type]


def load_arrays(directory: Path) -> tuple[dict[str, Any], dict[str, list[np.ndarray]]] | None:
    """save_arrays' (meta, arrays) back, or None when `directory` holds none yet. Raises CheckpointError for a file
    that is not such an archive, or a folder that holds PyTorch's checkpoint instead."""
    path = directory / KERAS_LATEST
    if not path.exists():
        refuse_the_other_frameworks(directory, frameworks.TENSORFLOW)
        return None
    try:
        with np.load(path, allow_pickle=False) as archive:
            meta = json.loads(str(archive["meta"]))
            arrays: dict[str, list[np.ndarray]] = {}
            for key in sorted((k for k in archive.files if k != "meta"), key=lambda k: int(k.rsplit("/", 1)[1])):
                arrays.setdefault(key.rsplit("/", 1)[0], []).append(archive[key])
    except (ValueError, OSError, KeyError, zipfile.BadZipFile) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CheckpointError(
            f"cannot read checkpoint {path} ({reason}): move it away, or pass a --checkpoint-dir this trainer wrote"
        ) from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"refusing checkpoint {path}: its meta is not a JSON object")
    return meta, arrays
