"""Shared memory (/dev/shm) for the ranks: how much the container has, and a rank that ran out of it, told as such
(pure, but for the size). A DataLoader with worker processes hands every batch to its rank through /dev/shm, and
Docker gives a container 64 MB unless told more (`docker run --shm-size`); nothing inside the container can give it
more (a larger /dev/shm is a mount, which Docker's default capabilities do not allow). So the smoke role says how
much the ranks have in its first line, and a rank that ran out fails naming shared memory and the flag that fixes it,
torch's own message after it."""

from __future__ import annotations

import os
import re

from launcher.core.protocol import SHM_SIZE

PATH = "/dev/shm"
RAN_OUT = re.compile(
    r"unable to allocate shared memory|insufficient shared memory|out of shared memory"
    r"|unable to (?:write to|open shared memory object|mmap \d+ bytes from) file </torch_",
    re.IGNORECASE,
)
"""torch's ways of saying a rank or its DataLoader workers found /dev/shm full: its allocator (`unable to allocate
shared memory(shm) for file </torch_...>`), a worker's bus error (`... insufficient shared memory (shm)`), the
loader's `... are out of shared memory`, older allocators' `unable to write to file </torch_...>`."""


def size_bytes(path: str = PATH) -> int | None:
    """The size of the shared memory file system; None where there is none."""
    try:
        found = os.statvfs(path)
    except OSError:
        return None
    return found.f_blocks * found.f_frsize


def shown(size: int | None) -> str:
    """`/dev/shm 64 MB`, as the first line and the advice say it."""
    return f"{PATH} {size / 1024**2:.0f} MB" if size is not None else f"no {PATH}"


def ran_out(text: str) -> bool:
    """Whether a rank's output says it (or its DataLoader workers) ran out of shared memory."""
    return bool(RAN_OUT.search(text))


def explained(error: str | None, size: int | None) -> str:
    """A rank's error, when it ran out of shared memory: the problem and the fix first, torch's line after."""
    told = (
        f"out of shared memory ({shown(size)}, shared by the ranks and their DataLoader workers): "
        f"give the container more, docker run --shm-size {SHM_SIZE} ..."
    )
    return f"{told} ({error})" if error else told
