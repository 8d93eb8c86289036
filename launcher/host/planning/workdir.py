"""The user's code folder (--workdir): what of it travels, and the tar archive for Container.put_archive, owned by
the image's user.

The same archive is copied to /workdir in every worker container, so every rank finds the same code at the same
path without NFS. Only regular files and folders travel: a symlink, FIFO, socket or device node stays behind (a link
could name a file outside the folder). So do caches and version-control folders (silently), secrets (`.env`,
`.env.*`, `.ssh/`, `*.pem`, `*.key`, and SSH private keys by their usual names, `id_rsa` and the like) and what a
`.launcherignore` at the folder's top lists; `Packed.skipped` names those, for the launcher's one line about them.

`.launcherignore` is read as git reads a `.gitignore` (pathspec's GitIgnoreSpec): `name`, `dir/`, `/anchored`,
globs, `**`, `!negation` and comments; a negation never takes a secret back. Only the folder's top-level
`.launcherignore` is read.
"""

from __future__ import annotations

import io
import os
import re
import stat
import tarfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pathspec

from launcher.core.protocol import MPIUSER_UID

CACHES = {"__pycache__", ".git", ".venv", ".mypy_cache", ".pytest_cache"}
"""Folders left behind without a word: caches and version control, never the job's code."""
SECRET_DIRS = {".ssh"}
SECRET_SUFFIXES = (".pem", ".key")
SSH_PRIVATE_KEYS = {"id_rsa", "id_dsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519", "id_ed25519_sk"}
IGNORE_FILE = ".launcherignore"
SECRET = "secrets"
IGNORED = IGNORE_FILE
NAMED_LIMIT = 8
"""How many skipped paths the one line names before it counts the rest."""


@dataclass(frozen=True)
class Skip:
    path: str
    """Relative to the folder, POSIX style; a folder's ends in `/`."""
    why: str
    """SECRET, IGNORED, or the kind of file that is not copied: symlink, FIFO, socket, device node."""


@dataclass(frozen=True)
class Entry:
    path: str
    """Relative to the folder, POSIX style."""
    is_dir: bool
    size: int


@dataclass(frozen=True)
class Selection:
    """What of the folder travels (folders before what they hold) and what stays behind, with why."""

    entries: tuple[Entry, ...]
    skipped: tuple[Skip, ...]

    @property
    def payload_bytes(self) -> int:
        return sum(entry.size for entry in self.entries)


@dataclass(frozen=True)
class Packed:
    archive: bytes
    skipped: tuple[Skip, ...]


class IgnoreFileError(ValueError):
    """A .launcherignore line that is no pattern; the message is one line naming the line and the fix."""


def parse_ignore(text: str, source: str = IGNORE_FILE) -> pathspec.GitIgnoreSpec:
    """The patterns of a .launcherignore, read as git reads a .gitignore (pathspec's GitIgnoreSpec)."""
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        try:
            pathspec.GitIgnoreSpec.from_lines([line])
        except (ValueError, re.error) as error:  # pathspec's GitWildMatchPatternError, or a bad [range]
            raise IgnoreFileError(
                f"{source} line {number}: {line.strip()!r} is not a pattern ({error}): fix or remove the line"
            ) from None
    return pathspec.GitIgnoreSpec.from_lines(lines)


def ignored(spec: pathspec.GitIgnoreSpec, path: str, is_dir: bool) -> bool:
    """Whether the .launcherignore leaves `path` (relative, POSIX style) behind."""
    return spec.match_file(path + "/" if is_dir else path)


def is_secret(name: str, is_dir: bool) -> bool:
    if is_dir:
        return name in SECRET_DIRS
    return name == ".env" or name.startswith(".env.") or name.endswith(SECRET_SUFFIXES) or name in SSH_PRIVATE_KEYS


def special_kind(mode: int) -> str | None:
    """What a file that is not copied is (a symlink, a FIFO, ...); None for a regular file or a folder."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device node"
    return "special file"


def select(folder: Path) -> Selection:
    """Walks `folder` without following links: what travels, and what stays behind with why."""
    ignore_file = folder / IGNORE_FILE
    spec = parse_ignore(ignore_file.read_text(encoding="utf-8") if ignore_file.is_file() else "", str(ignore_file))
    entries: list[Entry] = []
    skipped: list[Skip] = []

    def walk(directory: Path, prefix: str) -> None:
        for child in sorted(os.scandir(directory), key=lambda item: item.name):
            if child.name in CACHES:
                continue
            path = prefix + child.name
            found = child.stat(follow_symlinks=False)
            mode = found.st_mode
            is_dir = stat.S_ISDIR(mode)
            shown = path + "/" if is_dir else path
            kind = special_kind(mode)
            if is_secret(child.name, is_dir):
                skipped.append(Skip(shown, SECRET))
            elif ignored(spec, path, is_dir):
                skipped.append(Skip(shown, IGNORED))
            elif kind:
                skipped.append(Skip(path, kind))
            elif is_dir:
                entries.append(Entry(path, True, 0))
                walk(Path(child.path), path + "/")
            else:
                entries.append(Entry(path, False, found.st_size))

    walk(folder, "")
    return Selection(tuple(entries), tuple(skipped))


def payload_bytes(folder: Path) -> int:
    """The bytes archive() copies: the regular files that travel (select)."""
    return select(folder).payload_bytes


def pack(folder: Path, uid: int = MPIUSER_UID) -> Packed:
    """The folder's archive (what select lets travel, owned by `uid`) and what stayed behind."""
    selection = select(folder)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for entry in selection.entries:
            add(tar, folder, entry, uid)
    return Packed(buffer.getvalue(), selection.skipped)


def archive(folder: Path, uid: int = MPIUSER_UID) -> bytes:
    return pack(folder, uid).archive


def add(tar: tarfile.TarFile, folder: Path, entry: Entry, uid: int) -> None:
    """One entry as a plain member: no links (a hard link would point at a member that may have stayed behind),
    no set-ID bits. A file is opened without following links, so one swapped for a link meanwhile is refused."""
    info = tarfile.TarInfo(entry.path)
    info.uid = info.gid = uid
    info.uname = info.gname = ""
    if entry.is_dir:
        found = os.lstat(folder / entry.path)
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, stat.S_IMODE(found.st_mode) & 0o777, int(found.st_mtime)
        tar.addfile(info)
        return
    fd = os.open(folder / entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        found = os.fstat(handle.fileno())
        if not stat.S_ISREG(found.st_mode):
            raise OSError(f"{folder / entry.path} is no longer a regular file")
        info.size, info.mode, info.mtime = found.st_size, stat.S_IMODE(found.st_mode) & 0o777, int(found.st_mtime)
        tar.addfile(info, handle)


def skipped_line(skipped: tuple[Skip, ...] | list[Skip]) -> str | None:
    """One line saying what the copy left behind, e.g. `skipped .env, .ssh/, id_rsa.key (secrets, .launcherignore)
    and 2 symlinks`; None when nothing worth saying was."""
    named = [skip for skip in skipped if skip.why in (SECRET, IGNORED)]
    parts = []
    if named:
        shown = ", ".join(skip.path for skip in named[:NAMED_LIMIT])
        if len(named) > NAMED_LIMIT:
            shown += f", +{len(named) - NAMED_LIMIT} more"
        reasons = ", ".join(dict.fromkeys(skip.why for skip in named))
        parts.append(f"{shown} ({reasons})")
    counted = Counter(skip.why for skip in skipped if skip.why not in (SECRET, IGNORED))
    parts += [f"{count} {kind}{'s' if count > 1 else ''}" for kind, count in counted.items()]
    if not parts:
        return None
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"skipped {listed}"
