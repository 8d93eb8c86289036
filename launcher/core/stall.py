"""A stalled job, noticed by itself: what counts as a stall, Horovod's own stall warnings, and the stall record.

A running job that prints nothing and records no new metrics for the stall timeout is stalled (a hung job and a
slow one look alike from outside; this is the line between them). Horovod's stall inspector also warns when some
ranks wait in a collective that others never joined ("Missing ranks:"); those lines are picked out of the job's
output. The job agent's stall watch (launcher/agent/watches.py) watches, gathers every rank's stack once
(launcher/agent/stacks.py) and writes a StallRecord to JOB_STALL, which `launcher status` reads.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

from launcher.core.ranktag import untagged

STALL_ACTIONS = ("warn", "fail")
"""What the agent does about a stall: record it and gather the stacks (warn), or also end the job (fail)."""
POLL_SECONDS = 5
"""How often a stall watch looks, at most (poll_seconds)."""
MISSING_RANKS = "Missing ranks:"
WARNING_MARKS = ("stall_inspector.cc", "One or more tensors were submitted", "is stalled for longer than")
MISSING_RANK_LINE = re.compile(r"\s*(\d+)!?: \[(.*)\]\s*")
REFUSAL_MARK = "horovod-stack: refused a rendezvous request from "
"""How horovodrun's line for a stranger's refused request begins (docker/horovod-runner/stack_guard.py's
REFUSAL_LINE): anyone who reaches the port can make one, so it is no sign of the job's progress."""


def idle_seconds(output_age: float, metrics_age: float | None) -> float:
    """How long the job has shown no sign of progress: the newer of its last output and its last metrics."""
    return output_age if metrics_age is None else min(output_age, metrics_age)


def is_progress(line: str) -> bool:
    """Whether a line of the job's output (not a stall warning) shows the job doing something."""
    return REFUSAL_MARK not in line


def is_stalled(idle: float, timeout: float) -> bool:
    return timeout > 0 and idle >= timeout


def poll_seconds(timeout: float) -> float:
    """How often a stall watch looks: every 5 s, or a quarter of a shorter stall timeout (1 s at least)."""
    return min(POLL_SECONDS, max(1.0, timeout / 4))


def notice(idle: float, timeout: float) -> str:
    """The line a stall watch says when the job stalls, before every rank's stack."""
    return f"the job looks stalled: no output and no new metrics for {idle:.0f} s (stall timeout {timeout} s)"


def cause(idle: float, where: str) -> str:
    """A stall as the job's error, with the stacks' summary of where the ranks are (`where`)."""
    return f"the job stalled: no output and no new metrics for {idle:.0f} s; {where or 'no stacks'}"


def ending(cause: str) -> str:
    """The line that ends a job for a stall (the stall action fail)."""
    return f"error: {cause}; ending the job (stall action fail)"


class HorovodWarnings:
    """Reads the job's output a line at a time and keeps Horovod's latest stall warning, as one line."""

    def __init__(self) -> None:
        self.latest: str | None = None
        self._missing: list[str] | None = None

    def feed(self, line: str) -> bool:
        """Takes one line of output (tagged with its rank or not); True if it was part of a stall warning (which is
        no sign of progress)."""
        line = untagged(line)
        if MISSING_RANKS in line:
            self._missing = []
            return True
        if self._missing is not None:
            match = MISSING_RANK_LINE.fullmatch(line)
            if match:
                self._missing.append(f"rank {match[1]} missing from {match[2]}")
                return True
            self._end()
        return any(mark in line for mark in WARNING_MARKS)

    def _end(self) -> None:
        if self._missing:
            self.latest = "Horovod: " + "; ".join(self._missing)
        self._missing = None

    def current(self) -> str | None:
        if self._missing:
            self._end()
        return self.latest


@dataclass(frozen=True)
class StallRecord:
    """What JOB_STALL holds while the job runs: a stall (how long, and where the ranks are) and Horovod's warning."""

    idle_seconds: int = 0
    """Seconds without output or new metrics when a stall was last seen; 0: not stalled now."""
    where: str = ""
    """The stacks' summary (stacks.summary): the odd ranks out and where the others wait."""
    horovod: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | None) -> StallRecord | None:
        try:
            data = json.loads(text or "")
        except json.JSONDecodeError:
            return None
        return cls(**data) if isinstance(data, dict) else None

    def describe(self) -> str:
        """For `launcher status`: '; stalled for 40 s: rank 1 (...) in wait at x.py:3 ...' or Horovod's warning."""
        parts = []
        if self.idle_seconds:
            parts.append(f"stalled for {self.idle_seconds} s" + (f": {self.where}" if self.where else ""))
        if self.horovod:
            parts.append(self.horovod)
        return "; ".join(parts)
