"""A failed run's ranks' errors, as the job agent learns them: the records the ranks write when they die
(app/rank_error.py), taken from the job's output line by line (each line's rank tag off: launcher/core/ranktag.py), and
the one line that names the failed rank, its node and its error. Pure: the transport feeds it the lines.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.rank_error import RankError, first_cause
from launcher.core.jobspec import Worker
from launcher.core.ranktag import untagged

RECORDS_KEPT = 64
"""Records kept per run: the real cause comes early; a large job's other ranks each add Horovod's shut-down."""


class RankErrors:
    """The records of one run's output, in the order they came."""

    def __init__(self) -> None:
        self.seen: list[RankError] = []

    def feed(self, line: str) -> bool:
        """Takes the record a line of the job's output holds; True: it was one (the job's log leaves it out: the
        traceback above it says the same to a reader)."""
        record = RankError.from_line(untagged(line.rstrip("\r\n")))
        if record is None:
            return False
        if len(self.seen) < RECORDS_KEPT:
            self.seen.append(record)
        return True

    def cause(self) -> RankError | None:
        """The record that names why the run failed (app/rank_error.py first_cause); None: no rank wrote one."""
        return first_cause(self.seen)


def node_of(record_node: str, rank: int, workers: Sequence[Worker], slots: Sequence[int] | None) -> str:
    """The node a rank ran on, as logs and errors name it: by the placement of a fixed-size job (`slots`: each
    worker's rank count in hostfile order, which mpirun's `-map-by slot` fills in order), else by the host its record
    names (an elastic job's ranks move: horovodrun names its hosts by the workers' addresses), else that host."""
    if slots is not None:
        placed = [worker.name for worker, count in zip(workers, slots, strict=True) for _ in range(count)]
        if rank < len(placed):
            return placed[rank]
    return next((worker.name for worker in workers if record_node in (worker.address, worker.name)), record_node)
