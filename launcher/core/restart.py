"""Restarting a fixed-size job that lost a node (--max-restarts, MAX_RESTARTS): which ended runs are started again,
on which workers, and the one line each restart is said and recorded in. Pure: `decide` takes a run's RunResult
(launcher/core/runs.py) and returns Restart or NotRestarted, each a record with its reason as a field; the job agent
(launcher/agent/restarter.py) does what it decides, and records each restart (Restart.record) for `launcher status`.

A run that lost a node is started again from the newest checkpoint in the shared folder: on every worker when the
lost ones answer again, else on those that remain when the user allowed a smaller world (--min-nodes). A failure of
the script itself (no node lost) is started again once at most: a second would fail the same way.

Also a worker's own restarts (--restart-workers): which worker containers their node's engine starts again after
they failed, and how often (worker_restarts, worker_restart_policy). The one part of it that only the container can
apply, that a worker that stopped by itself stays stopped when its engine starts it again, is docker/entrypoint.sh's
(RESTART_ON_FAILURE).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum

from launcher.core import metrics
from launcher.core.option_names import OptionNames
from launcher.core.runs import RunResult, RunState

RESTART_WAIT_SECONDS = 30
"""How long the agent waits for a lost node's worker to answer again when the job may not go on without it."""
SCRIPT_RESTARTS = 1
"""How often a failure of the script itself (a non-zero exit, no node lost) is started again at most."""
STOP_STATUSES = frozenset(128 + signum for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
"""A job that exits so with no node lost was told to stop (Ctrl-C, docker stop): not restarted."""
RECORDS_FILE = "restarts.jsonl"
"""In the run folder: one JSON object per restart (Restart.record)."""


def worker_restarts(restart_workers: bool, most: int, holds_driver: bool) -> int:
    """How often a worker's node engine starts it again after it failed (--restart-workers, at most `most` times,
    --worker-restarts): never the one that holds the job's driver (rank 0's: the agent and the elastic driver)."""
    return most if restart_workers and not holds_driver else 0


def worker_restart_policy(restarts: int) -> dict[str, str | int] | None:
    """The engine's restart policy for a worker started again `restarts` times at most: only after it failed (a crash,
    an out-of-memory kill); a container stopped by hand (`docker stop`, `docker kill`) is not started again."""
    return {"Name": "on-failure", "MaximumRetryCount": restarts} if restarts else None


def metrics_epoch(metrics_text: str | None) -> int | None:
    """The last epoch the bundled trainer recorded in its metrics.jsonl (its checkpoint is of that epoch); None
    without one. A line cut short (the run was killed while writing it) is left out."""
    record = metrics.last_record(metrics_text, ("epoch",))
    return int(record["epoch"]) if record else None


class Why(StrEnum):
    """Why an ended run is not started again."""

    SUCCEEDED = "succeeded"
    RESTARTS_OFF = "restarts_off"
    STOP_ASKED = "stop_asked"
    ENDED_BY_WATCH = "ended_by_watch"
    USED_UP = "used_up"
    SCRIPT_FAILED_AGAIN = "script_failed_again"
    LOST_DID_NOT_RETURN = "lost_did_not_return"
    TOO_FEW_LEFT = "too_few_left"


@dataclass(frozen=True)
class NotRestarted:
    """The decision to end the job as its last run ended: why, and the line that says so ("" where there is nothing
    to say: the run succeeded, or restarts are off)."""

    why: Why
    reason: str = ""

    def to_record(self) -> dict:
        return {"why": self.why.value, "reason": self.reason}

    @classmethod
    def from_record(cls, data: dict) -> NotRestarted:
        """to_record's dict read back (ValueError, TypeError or KeyError for anything else)."""
        return cls(Why(data["why"]), str(data.get("reason") or ""))


def refusal(
    run: RunResult, *, stop_asked: bool, history: Sequence[Restart], max_restarts: int, say: OptionNames
) -> NotRestarted | None:
    """Why the ended `run` is not started again, whatever workers answer; None when it may be (decide then says on
    which workers). `history`: the restarts made so far."""
    status, lost = run.status, run.lost
    if max_restarts == 0:
        return NotRestarted(Why.RESTARTS_OFF)
    if run.state is RunState.SUCCEEDED or status == 0:
        return NotRestarted(Why.SUCCEEDED)
    if stop_asked or (not lost and status in STOP_STATUSES):
        return NotRestarted(Why.STOP_ASKED, f"not restarted: the job was told to stop (exit status {status})")
    if run.state.ended_by_watch:
        return NotRestarted(Why.ENDED_BY_WATCH, f"not restarted: {run.state.ended_by_watch} ended it, not a lost node")
    if len(history) >= max_restarts:
        return NotRestarted(
            Why.USED_UP,
            f"not restarted: all {max_restarts} restart(s) ({say.of('max_restarts', max_restarts)}) are used up; "
            f"allow more with a larger {say.of('max_restarts')}",
        )
    script_restarts = sum(1 for done in history if done.after is RunState.FAILED)
    if not lost and script_restarts >= SCRIPT_RESTARTS:
        return NotRestarted(
            Why.SCRIPT_FAILED_AGAIN,
            f"not restarted: the script itself failed again (exit status {status}) with no node lost, so another "
            "restart would fail the same way; the error is in the job's log above (restarts are for lost nodes)",
        )
    return None


def decide(
    run: RunResult,
    *,
    stop_asked: bool,
    history: Sequence[Restart],
    max_restarts: int,
    workers: Sequence[str],
    spares: Sequence[str],
    back: Sequence[str],
    min_workers: int | None,
    resume: tuple[int | None, str | None],
    say: OptionNames,
) -> Restart | NotRestarted:
    """Whether the ended `run` on `workers` starts again, and on which: each lost worker replaced by the next spare
    that answers (`spares`), else back when it answers again (`back`), else left out when `min_workers` allows; the
    restart records where it resumes (`resume`: the checkpointed epoch, the checkpoint folder)."""
    refused = refusal(run, stop_asked=stop_asked, history=history, max_restarts=max_restarts, say=say)
    if refused is not None:
        return refused
    lost = [loss.name for loss in run.lost]
    world, unreplaced = swap_in(workers, lost, spares)
    chosen = world_after(world, unreplaced, back, min_workers, say)
    if isinstance(chosen, NotRestarted):
        return chosen
    reason = " and ".join(loss.reason() for loss in run.lost) or f"the script failed (exit status {run.status})"
    return Restart(len(history) + 1, max_restarts, reason, tuple(chosen), *resume, after=run.state)


def swap_in(workers: Sequence[str], lost: Sequence[str], spares: Sequence[str]) -> tuple[list[str], list[str]]:
    """The workers with each lost one replaced, in its place, by the next spare that answers (`spares`, in order),
    and the lost ones no spare replaces."""
    replacing = dict(zip(lost, spares, strict=False))
    return [replacing.get(name, name) for name in workers], [name for name in lost if name not in replacing]


def must_wait(workers: int, lost: int, min_workers: int | None) -> bool:
    """Whether the agent waits for lost workers to answer again: the job may not go on with the rest."""
    return lost > 0 and workers - lost < (workers if min_workers is None else min_workers)


def world_after(
    workers: Sequence[str], lost: Sequence[str], back: Sequence[str], min_workers: int | None, say: OptionNames
) -> list[str] | NotRestarted:
    """The workers a restart runs on (rank 0's first, in the job's order): every one when the lost ones answer
    again (`back`), else those that remain when `min_workers` allows it; or, with no world, why not."""
    missing = [name for name in lost if name not in back]
    chosen = [name for name in workers if name not in missing]
    if not missing:
        return chosen
    if min_workers is None:
        return NotRestarted(
            Why.LOST_DID_NOT_RETURN,
            f"not restarted: {', '.join(missing)} did not answer again within {RESTART_WAIT_SECONDS} s and the job "
            f"may not run on fewer nodes: pass {say.of('elastic_min_workers', len(chosen))} to let it go on without "
            f"{'it' if len(missing) == 1 else 'them'}",
        )
    if len(chosen) < min_workers:
        return NotRestarted(
            Why.TOO_FEW_LEFT,
            f"not restarted: {len(chosen)} worker(s) remain, fewer than {say.of('elastic_min_workers', min_workers)}",
        )
    return chosen


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
    after: RunState = RunState.WORKERS_LOST
    """How the run it starts again ended: a failure of the script itself (FAILED) is restarted SCRIPT_RESTARTS times
    at most."""

    def line(self) -> str:
        """`restart 1/3: node_2 went silent; resuming after epoch 7 on node_1,node_3`."""
        return f"restart {self.number}/{self.of}: {self.reason}; {self.resuming()} on {','.join(self.workers)}"

    def resuming(self) -> str:
        if self.resume_epoch is not None:
            return f"resuming after epoch {self.resume_epoch}"
        if self.checkpoint_dir:
            return f"resuming from the newest checkpoint in {self.checkpoint_dir}"
        return "starting over"

    def to_record(self) -> dict:
        return {**asdict(self), "workers": list(self.workers), "after": self.after.value}

    def record(self) -> str:
        """One line of RECORDS_FILE."""
        return json.dumps(self.to_record()) + "\n"

    @classmethod
    def from_dict(cls, data: dict) -> Restart:
        """to_record's dict read back (ValueError, TypeError or KeyError for anything else)."""
        after = RunState(data.get("after", RunState.WORKERS_LOST))
        return cls(**{**data, "workers": tuple(data["workers"]), "after": after})

    @classmethod
    def from_record(cls, text: str) -> Restart:
        """record()'s line read back (ValueError, TypeError or KeyError for anything else)."""
        return cls.from_dict(json.loads(text))


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
