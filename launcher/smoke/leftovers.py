"""What the ranks leave behind, cleared before the smoke run's report is written: processes they started and left
running (a daemon, a detached child), and setuid or setgid bits they set in the user's checkout.

On a root-owned checkout (GitLab's runners) the ranks run as uid 0 without capabilities, and an owner may set the
setuid bit on its own files without any: `cp /bin/bash x; chmod 6755 x` would leave a root shell for any user of the
runner's host who reaches the folder. So the harness clears every such bit that was not there before the run
(running as the same uid, it owns every file the ranks could make). A leftover process could still rewrite the
report or set a bit again after that, so the harness first makes itself the ranks' child subreaper (orphans come to
it, not to the container's PID 1, where the harness is not PID 1: the GitLab template) and kills every process left.
"""

from __future__ import annotations

import ctypes
import os
import signal
import stat
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
"""prctl(2)'s option (linux/prctl.h)."""
SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID


def become_subreaper() -> bool:
    """Orphaned descendants come to this process; False where the kernel refused."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children(parent: int) -> list[int]:
    """The processes whose parent is `parent` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            # The command name, in parentheses, may hold spaces: the fields after its closing one are plain.
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent:
            found.append(int(entry))
    return found


def kill_leftovers() -> int:
    """Kills every process left below this one (those orphaned to it included) and reaps them; how many."""
    killed = 0
    while True:
        left = children(os.getpid())
        if not left:
            return killed
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        for pid in left:  # their own children come to this process as they die; the next round finds them
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def has_special_bits(path: Path) -> bool:
    try:
        mode = path.lstat().st_mode
    except OSError:
        return False
    return not stat.S_ISLNK(mode) and bool(mode & SPECIAL_BITS)


def with_special_bits(root: Path) -> set[Path]:
    """Every file and folder under root, root too (symbolic links not followed), with the setuid or setgid bit."""
    paths = [root]
    for folder, names, files in os.walk(root):
        paths.extend(Path(folder, name) for name in [*names, *files])
    return {path for path in paths if has_special_bits(path)}


def clear_new_special_bits(root: Path, before: set[Path]) -> list[Path]:
    """Clears the setuid and setgid bits of every file and folder under root that did not have them before; the
    paths it cleared (those it could not clear stay, as they are)."""
    cleared = []
    for path in sorted(with_special_bits(root) - before):
        try:
            # No rank is left to swap the path for a link now (kill_leftovers ran first).
            os.chmod(path, stat.S_IMODE(path.lstat().st_mode) & ~SPECIAL_BITS)
        except OSError:
            continue
        cleared.append(path)
    return cleared


def tidy(checkout: Path, special_before: set[Path]) -> None:
    """After the ranks: every process they left killed, then the bits they set cleared (said in one line)."""
    kill_leftovers()
    cleared = clear_new_special_bits(checkout, special_before)
    if cleared:
        print(cleared_line(checkout, cleared), flush=True)


def cleared_line(root: Path, cleared: list[Path]) -> str:
    shown = ", ".join(str(path.relative_to(root)) for path in cleared[:5]) + (", ..." if len(cleared) > 5 else "")
    return (
        f"smoke: cleared the setuid/setgid bits the ranks set on {len(cleared)} path(s) in {root}: {shown} "
        "(a setuid file in a checkout runs as its owner for anyone who can reach it)"
    )
