"""A rank's death as one typed record (RankError), the one place its marker and format are known: written on the rank's
stderr as one line, read back from the job's output by the job agent (launcher/agent/rank_errors.py) and the smoke run
(launcher/smoke/output.py), so nothing on the launching machine parses a rank's prose.

Who writes it: every Python rank in the images that dies of an uncaught exception, the bundled trainers and a user's
own script alike. The images' `horovod_stack_hint.pth` runs `install()` at every Python start (this file is copied
into site-packages as horovod_stack_rank_error.py, beside app/frameworks.py's hint; see the Dockerfile), which wraps
sys.excepthook; the record is written only where the job asked for it (VARIABLE=1 in the ranks' environment: every
launch method's mpirun or horovodrun line and the smoke run set it). The bundled trainers, which end a TrainingError
with one line of their own instead of a traceback, hand it to `report` (the same writer).

Stdlib-only and light: it is imported at the start of every Python process in the images, and the launcher reads
records with it (the rank side, app/, needs nothing from the launcher).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from types import TracebackType

MARKER = "horovod-stack rank error: "
"""What a record's line starts with; compact JSON follows on the same line."""
VARIABLE = "HOROVOD_STACK_RANK_ERRORS"
"""Set to 1 in the ranks' environment: they write a record when they die of an uncaught exception."""
RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
"""Where a rank's number is, in this order: horovodrun's (elastic ranks are renumbered), then Open MPI's."""
NODE_VARIABLE = "HOROVOD_HOSTNAME"
"""The host as horovodrun knows it (its host list's name); without it, the rank's host name."""
MESSAGE_LIMIT = 400
"""A record's message: the exception's first line, cut to this many characters."""
LINE_LIMIT = 1200
"""The longest line read as a record (its JSON escapes included); anything longer is not one."""
ONE_LINE = "horovod_stack_one_line"
"""The attribute in which an exception carries the one line the images' own hook ended it with instead of a
traceback (app/frameworks.py's wrong-image line, which sets it; neither module can import the other, each being copied
into site-packages under its own name): the record's message then, as more telling than Python's."""
NESTED_ERROR = re.compile(r"([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): (.+)")
"""The last line of a traceback inside an exception's message: `KIND: MESSAGE`."""
SECONDARY = "has been shut down"
"""In a rank's error when Horovod shut down because another rank failed first (`Horovod has been shut down. This was
caused by an exception on one of the ranks...`): a consequence, never the cause while another record is there."""


@dataclass(frozen=True)
class RankError:
    """One rank's uncaught exception: its rank, node, the exception's class name and its message's first line."""

    rank: int
    node: str
    kind: str
    message: str

    def to_line(self) -> str:
        """The record as one line: MARKER, then compact JSON."""
        return MARKER + json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_line(cls, text: str) -> RankError | None:
        """to_line's record read back from one line of output (its line break aside); None for anything else."""
        line = text.strip()
        if not line.startswith(MARKER) or len(line) > LINE_LIMIT:
            return None
        try:
            data = json.loads(line[len(MARKER) :])
        except ValueError:
            return None
        if not isinstance(data, dict) or set(data) != {"rank", "node", "kind", "message"}:
            return None
        rank, node, kind, message = data["rank"], data["node"], data["kind"], data["message"]
        if type(rank) is not int or rank < 0 or not all(isinstance(word, str) for word in (node, kind, message)):
            return None
        if not kind or len(message) > MESSAGE_LIMIT or "\n" in message:
            return None
        return cls(rank, node, kind, message)

    @property
    def secondary(self) -> bool:
        """Horovod shut down under it because another rank failed first."""
        return SECONDARY in self.message

    def error(self) -> str:
        """'RuntimeError: MESSAGE', as Python's traceback ends."""
        return f"{self.kind}: {self.message}" if self.message else self.kind


def first_cause(errors: Iterable[RankError]) -> RankError | None:
    """The record that names why the job failed, of those in the order they arrived: the first that is not Horovod's
    shut-down after another rank failed; failing that, the first."""
    seen = list(errors)
    return next((error for error in seen if not error.secondary), seen[0] if seen else None)


def of_exception(error: BaseException, environ: Mapping[str, str], host: Callable[[], str]) -> RankError | None:
    """The record of `error` raised on the rank whose launcher set `environ`; None outside a rank (no rank number)."""
    rank = next((int(value) for name in RANK_VARIABLES if (value := environ.get(name, "")).isdigit()), None)
    if rank is None:
        return None
    said = getattr(error, ONE_LINE, None)
    text = said.removeprefix("error: ") if isinstance(said, str) else str(error)
    kind, message = telling(type(error).__name__, text)
    return RankError(rank, environ.get(NODE_VARIABLE) or host(), kind, message[:MESSAGE_LIMIT])


def telling(kind: str, message: str) -> tuple[str, str]:
    """The kind and the one line of an exception's message that say most: its first line; but where its last line
    is an error's (`KIND: MESSAGE`), an error re-raised with the original's traceback in its message (a DataLoader
    worker's `Caught RuntimeError in DataLoader worker process 0.`, a tf.function's `in user code:`), that line,
    the original error's (`RuntimeError: unable to allocate shared memory...`), as that error's kind and message."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    original = NESTED_ERROR.fullmatch(lines[-1]) if len(lines) > 1 else None
    if original:
        return original[1].rsplit(".", 1)[-1], original[2]
    return kind, lines[0] if lines else ""


def report(error: BaseException) -> None:
    """Writes `error`'s record on stderr, where the job asked for records (VARIABLE=1) and this is a rank."""
    if os.environ.get(VARIABLE) != "1" or sys.stderr is None:
        return
    record = of_exception(error, os.environ, socket.gethostname)
    if record is not None:
        sys.stderr.write(record.to_line() + "\n")
        sys.stderr.flush()


def install() -> None:
    """Run at start-up in the images (their horovod_stack_hint.pth, after the hint's own hook): the hook already in
    place prints the traceback, then the record follows it as the rank's last line."""
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        try:
            previous(kind, error, trace)
        finally:
            try:
                report(error)
            except Exception:  # noqa: BLE001, S110  the rank is dying: its own traceback is what counts
                pass

    sys.excepthook = excepthook
