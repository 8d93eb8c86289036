"""Restarting a fixed-size job that lost a node (--max-restarts, MAX_RESTARTS): which ended runs are started again,
on which workers, and the one line each restart is said and recorded in. Pure: the job agent
(launcher/agent/restarts.py) does what these decide, and records each restart (Restart.record) for `launcher status`.

A run that lost a node is started again from the newest checkpoint in the shared folder: on every worker when the
lost ones answer again, else on those that remain when the user allowed a smaller world (--min-nodes). A failure of
the script itself (no node lost) is started again once at most: a second would fail the same way.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from launcher.core import metrics
from launcher.core.spelling import Spelling

RESTART_WAIT_SECONDS = 30
"""How long the agent waits for a lost node's worker to answer again when the job may not go on without it."""
SCRIPT_RESTARTS = 1
"""How often a failure of the script itself (a non-zero exit, no node lost) is started again at most."""
STOP_STATUSES = frozenset(128 + signum for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
"""A job that exits so with no node lost was told to stop (Ctrl-C, docker stop): not restarted."""
RECORDS_FILE = "restarts.jsonl"
"""In the run folder: one JSON object per restart (Restart.record)."""


def metrics_epoch(metrics_text: str | None) -> int | None:
    """The last epoch the bundled trainer recorded in its metrics.jsonl (its checkpoint is of that epoch); None
    without one. A line cut short (the run was killed while writing it) is left out."""
    record = metrics.last_record(metrics_text, ("epoch",))
    return int(record["epoch"]) if record else None


def why_not(
    *,
    status: int,
    lost: Sequence[str],
    ended_by: str | None,
    stop_asked: bool,
    restarts: int,
    script_restarts: int,
    max_restarts: int,
    say: Spelling,
) -> str | None:
    """Why an ended run is not started again ("" when there is nothing to say: it succeeded, or restarts are off);
    None when it is. `lost`: the workers it lost; `ended_by`: a watch that ended it (its time limit, a stall);
    `restarts`: restarts so far, `script_restarts` those for a failure of the script itself."""
    if max_restarts == 0 or status == 0:
        return ""
    if stop_asked or (not lost and status in STOP_STATUSES):
        return f"not restarted: the job was told to stop (exit status {status})"
    if ended_by:
        return f"not restarted: {ended_by} ended it, not a lost node"
    if restarts >= max_restarts:
        return (
            f"not restarted: all {max_restarts} restart(s) ({say.of('max_restarts', max_restarts)}) are used up; "
            f"allow more with a larger {say.of('max_restarts')}"
        )
    if not lost and script_restarts >= SCRIPT_RESTARTS:
        return (
            f"not restarted: the script itself failed again (exit status {status}) with no node lost, so another "
            "restart would fail the same way; the error is in the job's log above (restarts are for lost nodes)"
        )
    return None


def swap_in(workers: Sequence[str], lost: Sequence[str], spares: Sequence[str]) -> tuple[list[str], list[str]]:
    """The workers with each lost one replaced, in its place, by the next spare that answers (`spares`, in order),
    and the lost ones no spare replaces."""
    replacing = dict(zip(lost, spares, strict=False))
    return [replacing.get(name, name) for name in workers], [name for name in lost if name not in replacing]


def must_wait(workers: int, lost: int, min_workers: int | None) -> bool:
    """Whether the agent waits for lost workers to answer again: the job may not go on with the rest."""
    return lost > 0 and workers - lost < (workers if min_workers is None else min_workers)


def world_after(
    workers: Sequence[str], lost: Sequence[str], back: Sequence[str], min_workers: int | None, say: Spelling
) -> tuple[list[str], str | None]:
    """The workers a restart runs on (rank 0's first, in the job's order): every one when the lost ones answer
    again (`back`), else those that remain when `min_workers` allows it; or, with no world, why not (one line)."""
    missing = [name for name in lost if name not in back]
    chosen = [name for name in workers if name not in missing]
    if not missing:
        return chosen, None
    if min_workers is None:
        return [], (
            f"not restarted: {', '.join(missing)} did not answer again within {RESTART_WAIT_SECONDS} s and the job "
            f"may not run on fewer nodes: pass {say.of('elastic_min_workers', len(chosen))} to let it go on without "
            f"{'it' if len(missing) == 1 else 'them'}"
        )
    if len(chosen) < min_workers:
        return [], (
            f"not restarted: {len(chosen)} worker(s) remain, fewer than {say.of('elastic_min_workers', min_workers)}"
        )
    return chosen, None


@dataclass(frozen=True)
class Restart:
    """One restart of the job, as it is said (line) and recorded (record)."""

    number: int
    of: int
    reason: str
    """What ended the run before: `node_2 went silent`, `the script failed (exit status 1)`."""
    workers: tuple[str, ...]
    resume_epoch: int | None = None
    """The bundled trainer: the last epoch its checkpoint holds (None: none yet, or a script of the user's)."""
    checkpoint_dir: str | None = None

    def line(self) -> str:
        """`restart 1/3: node_2 went silent; resuming after epoch 7 on node_1,node_3`."""
        return f"restart {self.number}/{self.of}: {self.reason}; {self.resuming()} on {','.join(self.workers)}"

    def resuming(self) -> str:
        if self.resume_epoch is not None:
            return f"resuming after epoch {self.resume_epoch}"
        if self.checkpoint_dir:
            return f"resuming from the newest checkpoint in {self.checkpoint_dir}"
        return "starting over"

    def record(self) -> str:
        """One line of RECORDS_FILE."""
        return json.dumps({**asdict(self), "workers": list(self.workers)}) + "\n"

    @classmethod
    def from_record(cls, text: str) -> Restart:
        """record()'s line read back (ValueError, TypeError or KeyError for anything else)."""
        data = json.loads(text)
        return cls(**{**data, "workers": tuple(data["workers"])})


def last_restart(records: str | None) -> str | None:
    """The last restart's line, from JOB_RESTARTS's records (for `launcher status` while the job runs); None before
    any restart. A record cut short (being written as it is read) is left out."""
    found = None
    for text in (records or "").splitlines():
        try:
            found = Restart.from_record(text).line()
        except (ValueError, TypeError, KeyError):
            continue
    return found
