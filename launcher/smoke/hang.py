"""Every rank's Python stack when a smoke run times out: py-spy, as `launcher stacks` takes them
(launcher/agent/stacks.py); where py-spy may not trace (the role started as root drops every capability, and a
container started as the owner may lack SYS_PTRACE, which py-spy's file capability needs), Python's own
faulthandler: the ranks run with PYTHONFAULTHANDLER=1, and SIGABRT makes each one print its threads' stacks as it
ends. Either way the stacks are grouped and worded by launcher/agent/stacks.py.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

from launcher.agent import stacks
from launcher.smoke.output import JobLog

NODE = "localhost"
ABORT_WAIT_SECONDS = 5.0
FATAL = "Fatal Python error: Aborted"
THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$")
FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def faulthandler_frames(lines: list[str]) -> tuple[stacks.Frame, ...]:
    """The main thread's frames, innermost first, from the last faulthandler dump in a rank's lines. Python lists
    threads newest first, so the main thread, the oldest, is the last block."""
    starts = [index for index, line in enumerate(lines) if line.strip() == FATAL]
    if not starts:
        return ()
    blocks: list[list[stacks.Frame]] = []
    for line in lines[starts[-1] + 1 :]:
        if THREAD.match(line.strip()):
            blocks.append([])
            continue
        found = FRAME.match(line)
        if found and blocks:
            blocks[-1].append(stacks.Frame(found.group(3), found.group(1), int(found.group(2))))
    return tuple(blocks[-1]) if blocks else ()


def rank_stack_text(stack: stacks.RankStack) -> str:
    """One rank's headline and frames, as `launcher stacks` prints a group."""
    return stacks.report([stack]).rstrip("\n")


def _gone(pid: int) -> bool:
    """Ended: no such process, or a zombie its parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _aborted(found: list[stacks.RankStack], log: JobLog, lock: threading.Lock) -> list[stacks.RankStack]:
    """SIGABRT to every rank; their faulthandler dumps, read back from their output."""
    for stack in found:
        try:
            os.kill(stack.pid, signal.SIGABRT)
        except OSError:
            pass
    deadline = time.monotonic() + ABORT_WAIT_SECONDS
    while time.monotonic() < deadline and not all(_gone(stack.pid) for stack in found):
        time.sleep(0.1)
    time.sleep(0.5)  # their last lines, through horovodrun to our reader
    with lock:
        texts = {rank: [line.text for line in log.tail] for rank, log in log.ranks.items()}
    taken = []
    for stack in found:
        frames = faulthandler_frames(texts.get(stack.rank, []))
        error = None if frames else f"{stack.error}; and no faulthandler stack came back"
        taken.append(stacks.RankStack(stack.rank, stack.node, stack.pid, frames, error))
    return taken


def take(log: JobLog, lock: threading.Lock) -> tuple[list[stacks.RankStack], str]:
    """Every rank's stack now, and how it was taken."""
    found = stacks.collect(NODE)
    if found and all(stack.error for stack in found):
        return _aborted(found, log, lock), "py-spy could not trace here, so Python's faulthandler"
    return found, "py-spy"
