"""The stall watch of a Slurm batch script (`launcher export sbatch --stall-timeout N`), in the SIF on the job's first
node, as two commands the script runs (launcher/slurm/sbatch.py stall_lines):

- `python -m launcher.agent.batch_stall wait --ranks PID --timeout N [--metrics FILE] [--after T]` returns (status
  0) once the job stalls (launcher/core/stall.py: its output, this command's own stdout, and its metrics file have
  not changed for N seconds), saying so in the output; status 1 once process PID (the ranks' srun) has ended. With
  --after T (seconds since the epoch, when the last stall's stacks were written) a stall counts only after the job
  showed progress since then: one stall, one report.
- `python -m launcher.agent.batch_stall report --timeout N [--fail]` reads what every node's `python -m
  launcher.agent.stacks collect` printed (one JSON list a line) and prints every rank's stack, grouped as `launcher
  stacks` prints them; with --fail, the line that ends the job, naming the stall and where the ranks are.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from launcher.agent import stacks
from launcher.core import stall

NOT_THERE = -1.0
"""The mtime of a file that is not there (yet): no sign of progress."""


def new_stall(
    now: float, output_mtime: float, metrics_mtime: float | None, timeout: float, after: float
) -> float | None:
    """How long the job has been stalled, if it is and showed progress after `after` (the last report); else None."""
    if max(output_mtime, metrics_mtime or NOT_THERE) <= after:
        return None
    metrics_age = None if metrics_mtime is None else now - metrics_mtime
    idle = stall.idle_seconds(now - output_mtime, metrics_age)
    return idle if stall.is_stalled(idle, timeout) else None


def mtime(path: str | None) -> float | None:
    """A file's mtime; NOT_THERE for a file not there yet, None without a file."""
    if path is None:
        return None
    try:
        return os.stat(path).st_mtime
    except OSError:
        return NOT_THERE


def wait(
    ranks: int,
    timeout: float,
    metrics: str | None,
    after: float,
    *,
    output_mtime: Callable[[], float] = lambda: os.fstat(sys.stdout.fileno()).st_mtime,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> float | None:
    """Polls until the job stalls (its idle seconds), or the ranks' process ends (None)."""
    while Path(f"/proc/{ranks}").exists():
        idle = new_stall(clock(), output_mtime(), mtime(metrics), timeout, after)
        if idle is not None:
            return idle
        sleep(stall.poll_seconds(timeout))
    return None


def collected(lines: Iterable[str]) -> list[stacks.RankStack]:
    """Every node's ranks from `collect`'s lines (any other line, e.g. a warning of Apptainer's, left out)."""
    found: list[stacks.RankStack] = []
    for line in lines:
        try:
            found += stacks.from_json(line)
        except (ValueError, KeyError, TypeError):
            continue
    return found


def report(found: list[stacks.RankStack], timeout: float, fail: bool) -> str:
    """Every rank's stack, grouped; with `fail`, the line ending the job for the stall."""
    text = stacks.report(found)
    if fail:
        text += stall.ending(stall.cause(timeout, stacks.summary(found) if found else "")) + "\n"
    return text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.agent.batch_stall", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    waiting = commands.add_parser("wait", help="return once the job stalls (0), or its ranks ended (1)")
    waiting.add_argument("--ranks", type=int, required=True, help="the process id of the ranks' srun")
    waiting.add_argument("--timeout", type=int, required=True, help="the stall timeout, seconds")
    waiting.add_argument("--metrics", help="the job's metrics file")
    waiting.add_argument("--after", type=float, default=0.0, help="when the last stall's stacks were written")
    reporting = commands.add_parser("report", help="every rank's stack, grouped, from collect's lines on stdin")
    reporting.add_argument("--timeout", type=int, required=True, help="the stall timeout, seconds")
    reporting.add_argument("--fail", action="store_true", help="say that the stall ends the job")
    options = parser.parse_args(argv)
    if options.command == "wait":
        idle = wait(options.ranks, options.timeout, options.metrics, options.after)
        if idle is None:
            return 1
        print(f"{stall.notice(idle, options.timeout)}; every rank's stack:", flush=True)
        return 0
    sys.stdout.write(report(collected(sys.stdin), options.timeout, options.fail))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
