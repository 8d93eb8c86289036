"""A job's mounts: host folders every worker gets (--mount HOST_PATH:CONTAINER_PATH[:ro], MOUNTS in .env), and the
rule that keeps them clear of the stack's own files and the system's. Pure.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from launcher.core.protocol import HOME, SHARED_MOUNT, WORKDIR

STACK_PATHS = (HOME, "/cluster", "/opt/horovod-stack", "/opt/venv")
"""The stack's own files in a worker (its user's home and job files, the cluster's SSH trust, its code, its Python): a
mount may go neither at, under nor above them, so no job can replace a key, the agent or the interpreter."""
JOB_FOLDERS = (SHARED_MOUNT, WORKDIR)
"""The job's folders: a mount may go inside them (a dataset at /shared/data) but neither replace nor cover them."""
SYSTEM_PATHS = ("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/proc", "/sys", "/dev")
"""The system's folders, which no mount may be at or under (/bin, /sbin and /lib are /usr's under merged /usr)."""
MOUNT_FIX = "mount it elsewhere, e.g. /data"


@dataclass(frozen=True)
class Bind:
    """A host folder in every worker (--mount HOST_PATH:CONTAINER_PATH[:ro]), e.g. a dataset on each node's disk."""

    source: str
    target: str
    read_only: bool = False

    def __str__(self) -> str:
        return f"{self.source} -> {self.target}{' (read-only)' if self.read_only else ''}"


def bind_problem(text: str, name: str = "--mount") -> str | None:
    """Why `text` is not HOST_PATH:CONTAINER_PATH[:ro|rw], both absolute, its target (normalised: /data/../cluster is
    /cluster) clear of the stack's and the system's folders; None if it is. `name`: how the launch method's users set
    it."""
    parts = text.split(":")
    if len(parts) == 3 and parts[2] in ("ro", "rw"):
        parts.pop()
    if len(parts) != 2 or not all(part.startswith("/") for part in parts):
        return f"{name} {text!r} is not HOST_PATH:CONTAINER_PATH[:ro], both absolute: e.g. /data:/data:ro"
    target = container_path(parts[1])
    problem = target_problem(target)
    if problem is None:
        return None
    normalised = f" (target {target})" if target != parts[1] else ""
    return f"{name} {text!r}{normalised} {problem}: {MOUNT_FIX}"


def target_problem(target: str) -> str | None:
    """Why a worker's normalised path `target` may not take a mount; None if it may."""
    if target == "/":
        return "would hide the whole container"
    covered = next((path for path in (*STACK_PATHS, *JOB_FOLDERS) if is_at_or_under(path, target)), None)
    if covered:
        return f"would hide the stack's own {covered}"
    inside = next((path for path in STACK_PATHS if is_at_or_under(target, path)), None)
    if inside:
        return f"is inside the stack's own {inside}"
    system = next((path for path in SYSTEM_PATHS if is_at_or_under(target, path)), None)
    if system:
        return f"is in the system's {system}"
    return None


def container_path(text: str) -> str:
    """An absolute path as the container resolves it, without `.`, `..` or repeated slashes."""
    return "/" + posixpath.normpath(text).lstrip("/")  # normpath keeps a leading "//"


def is_at_or_under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def parse_bind(text: str) -> Bind:
    """The Bind a valid mount (bind_problem) names, both paths normalised; raises ValueError naming the fix for one
    that is not."""
    problem = bind_problem(text)
    if problem:
        raise ValueError(problem)
    parts = text.split(":")
    return Bind(container_path(parts[0]), container_path(parts[1]), parts[2:] == ["ro"])
