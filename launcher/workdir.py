"""The user's code folder (--workdir) as a tar archive for Container.put_archive, owned by the image's user.

The same archive is copied to /workdir in every worker container, so every rank finds the same code at the same
path without NFS. Caches and version-control folders stay behind.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from launcher.core.protocol import MPIUSER_UID

SKIPPED = {"__pycache__", ".git", ".venv", ".mypy_cache", ".pytest_cache"}


def copied(relative: Path) -> bool:
    return not SKIPPED & set(relative.parts)


def payload_bytes(folder: Path) -> int:
    """The bytes archive() copies: regular files outside the skipped folders."""
    return sum(
        entry.stat().st_size
        for entry in folder.rglob("*")
        if copied(entry.relative_to(folder)) and entry.is_file() and not entry.is_symlink()
    )


def archive(folder: Path, uid: int = MPIUSER_UID) -> bytes:
    def owned(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if not copied(Path(info.name)):
            return None
        info.uid = info.gid = uid
        info.uname = info.gname = ""
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for entry in sorted(folder.iterdir()):
            tar.add(entry, arcname=entry.name, filter=owned)
    return buffer.getvalue()
