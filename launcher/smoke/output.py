"""horovodrun's output, line by line: which rank wrote it, and each rank's last error line (pure functions).

horovodrun --gloo prefixes every line a rank writes with `[RANK]<stdout>:` or `[RANK]<stderr>:`, and writes
`Process RANK exit with status code N.` for each rank that exits non-zero, in the order they end.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

RANK_LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")
RANK_EXIT = re.compile(r"^Process (\d+) exit with status code (-?\d+)\.$")
ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b(?::.*)?|(?:error|fatal)\b.*)$", re.I)
"""A line that states an error: a Python exception's last traceback line (`RuntimeError: ...`), or `error: ...`."""
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
    found = RANK_LINE.match(text)
    if found:
        return Line(int(found.group(1)), found.group(2), found.group(3))
    return Line(None, "stdout", text)


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


@dataclass
class RankLog:
    """One rank's recent lines."""

    rank: int
    tail: deque[Line] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))

    def last_error(self) -> str | None:
        return last_error_line(tuple(self.tail))

    def text(self) -> str:
        return "\n".join(line.text for line in self.tail)


@dataclass
class JobLog:
    """Every rank's recent lines, horovodrun's own, and the ranks that exited non-zero in the order they ended."""

    size: int
    ranks: dict[int, RankLog] = field(default_factory=dict)
    driver: deque[Line] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    exits: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for rank in range(self.size):
            self.ranks.setdefault(rank, RankLog(rank))

    def add(self, line: Line) -> None:
        if line.rank is None:
            self.driver.append(line)
            ended = rank_exit(line)
            if ended:
                self.exits.append(ended)
        else:
            self.ranks.setdefault(line.rank, RankLog(line.rank)).tail.append(line)
