"""A run's results on this machine: `launcher results` copies a run folder (metrics.jsonl, summary.json, curves.png,
TensorBoard events, checkpoints) from the node that holds it, through the Docker API, for a running, ended or
already removed cluster: the run folder lives in the shared folder (SHARED_DIR), not in the containers. The archive is
unpacked as it arrives, never whole in memory; without checkpoints, the run folder's other parts are asked for one by
one, so checkpoints never cross the connection.
"""

from __future__ import annotations

import os
import shutil
import tarfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from launcher.host.engines import streams
from launcher.host.engines.node_engine import NodeEngine

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
    """Unpacks a run folder's archive (docker's get_archive) under `into` as it arrives; returns the files written.
    Only plain files and folders inside the run folder are taken (no links, no paths out of it)."""
    written = []
    with tarfile.open(fileobj=streams.reader(chunks), mode="r|") as archive:
        for member in archive:
            parts = PurePosixPath(member.name).parts
            if not (member.isfile() or member.isdir()) or ".." in parts or member.name.startswith("/"):
                continue
            if not checkpoints and len(parts) > 1 and parts[1] == CHECKPOINTS:
                continue
            if hasattr(tarfile, "data_filter"):
                archive.extract(member, into, filter="data")
            else:
                write_as_data(archive, member, into)
            if member.isfile():
                written.append(member.name)
    return sorted(written)


def fetch(engine: NodeEngine, image: str, shared_dir: str, name: str, into: Path, checkpoints: bool) -> list[str]:
    """Copies the run folder `name` from `engine`'s shared folder under `into`; returns the files written. Without
    checkpoints, each other part of the folder is its own archive: the checkpoints stay on the node."""
    if checkpoints:
        return extract(engine.run_archive(image, shared_dir, name), into)
    (into / name).mkdir(parents=True, exist_ok=True)
    written = []
    for entry in engine.run_entries(image, shared_dir, name):
        if entry != CHECKPOINTS:
            part = engine.run_archive(image, shared_dir, f"{name}/{entry}")
            written += [f"{name}/{path}" for path in extract(part, into / name)]
    return sorted(written)


def write_as_data(archive: tarfile.TarFile, member: tarfile.TarInfo, into: Path) -> None:
    """A folder or a plain file as tarfile's "data" extraction filter writes it, for the Pythons without the filters
    (PEP 706: 3.11.4 and later have them; Debian 12's python3 is 3.11.2): the file's bytes and time, no owner, the
    permissions without set-ID bits nor write for others, execute only where the owner has it."""
    target = into.joinpath(*PurePosixPath(member.name).parts)
    if member.isdir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    source = archive.extractfile(member)
    if source is None:
        return
    with source, target.open("wb") as out:
        shutil.copyfileobj(source, out)
    mode = member.mode & 0o755 | 0o600
    target.chmod(mode if mode & 0o100 else mode & ~0o111)
    os.utime(target, (member.mtime, member.mtime))


def runs_on(engines: Sequence[NodeEngine], image_of: Callable[[NodeEngine], str], shared_dir: str) -> list[Run]:
    """Every node's run folders, each listed with the image `image_of` names for its node."""
    return [
        Run(name, engine.node.name, modified)
        for engine in engines
        for name, modified in engine.list_runs(image_of(engine), shared_dir)
    ]
