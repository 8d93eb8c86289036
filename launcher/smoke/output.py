"""horovodrun's output, line by line: which rank wrote it, and each rank's error (pure functions).

horovodrun --gloo prefixes every line a rank writes with `[RANK]<stdout>:` or `[RANK]<stderr>:` (the rank tag,
launcher/core/ranktag.py), and writes
`Process RANK exit with status code N.` for each rank that exits non-zero, in the order they end.

A rank's error is its record (app/rank_error.py: every Python rank that dies of an uncaught exception writes one; the
run leaves the record's line out of what it shows). A rank that wrote none (killed by a signal, a program that is not
Python, horovodrun's own failure) is told by its last line that states an error (ERROR_LINE): the one place that
fallback is known.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from app.rank_error import RankError
from launcher.core.ranktag import split_tag

RANK_EXIT = re.compile(r"^Process (\d+) exit with status code (-?\d+)\.$")
ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b(?::.*)?|(?:error|fatal)\b.*)$", re.I)
"""A line that states an error, for output without a record: a Python exception's last traceback line
(`RuntimeError: ...`), or `error: ...`."""
TAIL_LINES = 200
RANKS_FAILED = "Horovod detected that one or more processes exited with non-zero status"
"""horovodrun's own traceback after a rank failed, which says no more than the rank's exit line before it."""
TRACEBACK = "Traceback (most recent call last):"


@dataclass(frozen=True)
class Line:
    rank: int | None
    """None: horovodrun's own line."""
    stream: str
    text: str

    def shown(self) -> str:
        """The line as the smoke run prints it: the rank first."""
        return f"[rank {self.rank}] {self.text}" if self.rank is not None else f"[horovodrun] {self.text}"


def parse(raw: str) -> Line:
    text = raw.rstrip("\r\n")
    tagged = split_tag(text)
    return Line(*tagged) if tagged else Line(None, "stdout", text)


def shown_driver_traceback(lines: list[Line]) -> list[str]:
    """horovodrun's own traceback, as shown: left out when it only repeats that a rank failed."""
    if any(RANKS_FAILED in line.text for line in lines):
        return []
    return [line.shown() for line in lines]


def rank_exit(line: Line) -> tuple[int, int] | None:
    """(rank, status) from horovodrun's line for a rank that exited non-zero."""
    found = RANK_EXIT.match(line.text) if line.rank is None else None
    return (int(found.group(1)), int(found.group(2))) if found else None


def last_error_line(lines: list[Line] | tuple[Line, ...]) -> str | None:
    """A rank's last line that states an error; failing that its last non-empty stderr line, then any line."""
    for wanted in (lambda line: ERROR_LINE.match(line.text.strip()), lambda line: line.stream == "stderr", bool):
        for line in reversed(lines):
            if line.text.strip() and wanted(line):
                return line.text.strip()
    return None


def starts_error(line: Line) -> bool:
    """A line that begins a rank's error report: a traceback, or an error line without one."""
    text = line.text.strip()
    return text == TRACEBACK or bool(text and ERROR_LINE.match(text))


@dataclass
class RankLog:
    """One rank's recent lines, when it first reported an error (the job's line count then), and its error's record
    if it wrote one."""

    rank: int
    tail: deque[Line] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    first_error: int | None = None
    record: RankError | None = None

    def last_error(self) -> str | None:
        """Its error: its record's, else its last line that states one."""
        return self.record.error() if self.record else last_error_line(tuple(self.tail))

    def only_shut_down(self) -> bool:
        """Its error is Horovod's shut-down after another rank failed (its record says so)."""
        return self.record is not None and self.record.secondary

    def text(self) -> str:
        return "\n".join(line.text for line in self.tail)


@dataclass
class JobLog:
    """Every rank's recent lines, horovodrun's own, and the ranks that exited non-zero in the order they ended."""

    size: int
    ranks: dict[int, RankLog] = field(default_factory=dict)
    driver: deque[Line] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    exits: list[tuple[int, int]] = field(default_factory=list)
    count: int = 0

    def __post_init__(self) -> None:
        for rank in range(self.size):
            self.ranks.setdefault(rank, RankLog(rank))

    def add(self, line: Line) -> bool:
        """Takes one line of the run's output; True: it was a rank's error record (not shown)."""
        self.count += 1
        record = RankError.from_line(line.text) if line.rank is not None else None
        if record is not None and line.rank is not None:
            rank = self.ranks.setdefault(line.rank, RankLog(line.rank))
            rank.record = rank.record or record
            rank.first_error = self.count if rank.first_error is None else rank.first_error
            return True
        if line.rank is None:
            self.driver.append(line)
            ended = rank_exit(line)
            if ended:
                self.exits.append(ended)
        else:
            rank = self.ranks.setdefault(line.rank, RankLog(line.rank))
            rank.tail.append(line)
            if rank.first_error is None and starts_error(line):
                rank.first_error = self.count
        return False

    def culprit(self, exits: list[tuple[int, int]]) -> int | None:
        """The rank that failed first: of those that exited non-zero, the first to report an error (horovodrun ends
        the other ranks once one exits, and a rank that raised may be slower to exit than one its end made fail);
        failing that, the first to exit. Once a rank has exited non-zero, a rank that reported an error counts too
        even without an exit line of its own: horovodrun may end it before it says how it exited. A rank whose record
        says Horovod shut down under it comes after those with an error of their own (app/rank_error.py)."""
        failed = {rank for rank, _ in exits}
        reported = sorted((log.only_shut_down(), log.first_error, rank) for rank, log in self.ranks.items()
                          if (rank in failed or exits) and log.first_error is not None)  # fmt: skip
        return reported[0][2] if reported else (exits[0][0] if exits else None)
