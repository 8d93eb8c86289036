"""Whether the run can write its JUnit report, checked before any rank starts. The entrypoint runs the role as the
owner of the current folder (the mounted checkout) wherever the container starts as root, the image's default; a
container started as another user (`docker run --user 1000`, a platform's assigned uid) runs as that user, which
may read the checkout but not write it: that matters only where the run must write, and is then said in one line."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def writable(path: Path) -> bool:
    return os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0))


def blocking_of(path: Path, can_write: Callable[[Path], bool] = writable) -> Path | None:
    """What keeps this process from writing `path`: the file, or its folder (the nearest one of its folders that
    exists, where the rest would be made); None if it can write it."""
    if path.exists():
        return None if can_write(path) else path
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return None if can_write(folder) else folder


def refusal(uid: int, report: Path, blocking: Path, owner: tuple[int, int]) -> str:
    """The one line a user who cannot write the report gets, with the fix."""
    return (
        f"smoke: failed: uid {uid} cannot write the JUnit report {report} ({blocking} is owned by {owner[0]}:"
        f"{owner[1]}): run the container as root, the image's default (no --user), or as the folder's owner,"
        ' docker run --user "$(id -u):$(id -g)" ...'
    )


def report_problem(report: Path) -> str | None:
    """Why the run could not write its report, in one line; None if it can."""
    blocking = blocking_of(report)
    if blocking is None:
        return None
    found = blocking.stat()
    return refusal(os.getuid(), report, blocking.absolute(), (found.st_uid, found.st_gid))
