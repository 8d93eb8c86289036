"""A run's results on this machine: `launcher results` copies a run folder (metrics.jsonl, summary.json, curves.png,
TensorBoard events, checkpoints) from the node that holds it, through the Docker API, for a running, ended or
already removed cluster: the run folder lives in the shared folder (SHARED_DIR), not in the containers.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from launcher.engine import NodeEngine

CHECKPOINTS = "checkpoints"


@dataclass(frozen=True)
class Run:
    name: str
    """The run folder's name: the cluster ID (the launcher), or compose's time-stamped RUN_ID."""
    node: str
    modified: int
    """Seconds since the epoch, as the node's clock has it."""


def choose(runs: list[Run], wanted: str | None) -> Run:
    """The run asked for, else the newest; ValueError listing the known runs if there is none such."""
    if runs and wanted is None:
        return max(runs, key=lambda run: run.modified)
    for run in runs:
        if run.name == wanted:
            return run
    known = ", ".join(f"{run.name} ({run.node})" for run in sorted(runs, key=lambda run: -run.modified)) or "none"
    raise ValueError(
        f"no run {wanted} in the shared folder of these nodes; the runs there: {known}"
        if wanted
        else "no run in the shared folder of these nodes yet: start one with `launcher start`"
    )


def extract(chunks: Iterable[bytes], into: Path, checkpoints: bool = True) -> list[str]:
    """Unpacks a run folder's archive (docker's get_archive) under `into`; returns the files written. Only plain
    files and folders inside the run folder are taken (no links, no paths out of it)."""
    archive = tarfile.open(fileobj=io.BytesIO(b"".join(chunks)))
    written = []
    for member in archive.getmembers():
        parts = PurePosixPath(member.name).parts
        if not (member.isfile() or member.isdir()) or ".." in parts or member.name.startswith("/"):
            continue
        if not checkpoints and len(parts) > 1 and parts[1] == CHECKPOINTS:
            continue
        archive.extract(member, into, filter="data")
        if member.isfile():
            written.append(member.name)
    return sorted(written)


def runs_on(engines: list[NodeEngine], image: str, shared_dir: str) -> list[Run]:
    return [
        Run(name, engine.node.name, modified)
        for engine in engines
        for name, modified in engine.list_runs(image, shared_dir)
    ]
