"""horovodrun started, its output shown rank by rank, ended after the timeout (every rank's stack first), stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TextIO

from app import rank_error
from launcher.agent import stacks
from launcher.smoke import hang
from launcher.smoke.output import TRACEBACK, JobLog, Line, parse, shown_driver_traceback

STOP_GRACE_SECONDS = 10.0
"""After SIGTERM horovodrun ends its ranks (SIGTERM, then SIGKILL after 5 s): what it gets before SIGKILL."""


def horovodrun_argv(size: int, command: list[str]) -> list[str]:
    """N ranks on this host over Gloo, on loopback alone: no ssh, no MPI, no other network."""
    return ["horovodrun", "--gloo", "-np", str(size), "-H", f"localhost:{size}", "--network-interfaces", "lo", *command]


def rank_environment(environ: Mapping[str, str], size: int, cpus: int) -> dict[str, str]:
    """The ranks' environment: CUDA hidden, Python's faulthandler on (the stacks at a timeout), no bytecode files
    left in the user's checkout, each rank's error as a record (app/rank_error.py), and, unless the caller set it, the
    CPUs shared out among the ranks (torch's and OpenMP's threads: each rank would take every CPU, and N ranks on a CI
    runner's few CPUs would crowd each other)."""
    return {
        "OMP_NUM_THREADS": str(max(1, cpus // size)),
        **environ,
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONFAULTHANDLER": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        rank_error.VARIABLE: "1",
    }


def cpu_count() -> int:
    """The CPUs this process may run on (a container's --cpuset-cpus), at least 1."""
    return len(os.sched_getaffinity(0)) or os.cpu_count() or 1


class Interrupted(Exception):
    def __init__(self, number: int) -> None:
        super().__init__(signal.Signals(number).name)
        self.number = number


@dataclass
class Finished:
    log: JobLog
    returncode: int
    seconds: float
    timed_out: bool = False
    stacks: list[stacks.RankStack] = field(default_factory=list)
    how: str = ""
    """How the stacks were taken."""
    exits: list[tuple[int, int]] | None = None
    """After a timeout: the ranks that had exited non-zero before it (not those the timeout ended)."""


def _raise_interrupted(number: int, frame: object) -> None:
    raise Interrupted(number)


def stop(process: subprocess.Popen) -> None:
    """horovodrun ends its ranks; whatever is left after the grace is killed."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        for _, pid in stacks.rank_processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        process.kill()
        process.wait()


def run(
    size: int, command: list[str], timeout: float, out: TextIO = sys.stdout, environ: Mapping[str, str] = os.environ
) -> Finished:
    """The command on `size` ranks; each line shown with its rank as it comes."""
    log, lock = JobLog(size), threading.Lock()
    started = time.monotonic()
    process = subprocess.Popen(
        horovodrun_argv(size, command),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=rank_environment(environ, size, cpu_count()),
        text=True,
        errors="replace",
        bufsize=1,
        start_new_session=True,
    )
    assert process.stdout is not None

    def pump() -> None:
        assert process.stdout is not None
        held: list[Line] = []  # horovodrun's own traceback, shown once it is whole
        for raw in process.stdout:
            line = parse(raw)
            with lock:
                record = log.add(line)
            if record:  # a rank's error record: its traceback above says the same to a reader
                continue
            if line.rank is None and (held or line.text.startswith(TRACEBACK)):
                held.append(line)
                continue
            for text in [*shown_driver_traceback(held), line.shown()]:
                print(text, file=out, flush=True)
            held.clear()
        for text in shown_driver_traceback(held):
            print(text, file=out, flush=True)

    reader = threading.Thread(target=pump, name="smoke-output", daemon=True)
    reader.start()
    previous = {number: signal.signal(number, _raise_interrupted) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            returncode = process.wait(timeout)
            timed_out, how, exits = False, "", None
            found: list[stacks.RankStack] = []
        except subprocess.TimeoutExpired:
            timed_out = True
            with lock:
                exits = list(log.exits)
            print(f"smoke: timed out after {timeout:.0f} s; taking every rank's Python stack", file=out, flush=True)
            found, how = hang.take(log, lock)
            stop(process)
            returncode = process.returncode
    except Interrupted:
        stop(process)
        raise
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    reader.join(5)
    return Finished(log, returncode, time.monotonic() - started, timed_out, found, how, exits)
