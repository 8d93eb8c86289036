"""A cluster's job state, from what its containers hold: pure parsing, for `launcher status`.

Inputs are read through each node's engine (launcher/host/engines/node_engine.py): rank 0's container state and
JOB_STATUS's record (the job agent's JobEnd, with the failed rank's error it took from the rank's record), each
worker's state, and the bundled trainer's metrics file in the cluster's run folder when there is one; this module only
decides what they mean and words it in one line. It reads records alone, never the job's output: a rank's error and
the epoch figures arrive as records (app/rank_error.py, app/metrics.py).
"""

from __future__ import annotations

from datetime import UTC, datetime

from launcher.core import metrics, restart
from launcher.core.jobend import parse_job_end
from launcher.core.stall import StallRecord
from launcher.host.engines.node_engine import ContainerState

NO_METRICS = "no epoch figures (no metrics file: the bundled trainer writes one, a script of your own does not)"
"""The progress said where the job's run folder holds no metrics file (yet)."""


def _ago(finished_at: str | None, now: datetime) -> str:
    if not finished_at or finished_at.startswith("0001-"):
        return ""
    stamp = datetime.fromisoformat(finished_at[:19]).replace(tzinfo=UTC)
    seconds = max(0, int((now - stamp).total_seconds()))
    return f", ended {seconds // 60} min {seconds % 60} s ago" if seconds >= 60 else f", ended {seconds} s ago"


def latest_record(metrics_text: str | None) -> dict | None:
    """The last complete record of a metrics file (a line being written as it is read is skipped)."""
    return metrics.last_record(metrics_text, ("epoch", "val_accuracy", "samples_per_sec"))


def progress(metrics_text: str | None) -> str:
    """'epoch 3 of 5, val accuracy 0.93, 6500 samples/s': the trainer's latest metrics record (`of 5` where the
    record holds the planned epochs)."""
    if metrics_text is None:
        return NO_METRICS
    record = latest_record(metrics_text)
    if not record:
        return "no epoch finished yet"
    of = f" of {record['epochs']}" if isinstance(record.get("epochs"), int) else ""
    return (
        f"epoch {record['epoch']}{of}, val accuracy {record['val_accuracy']:.4f}, "
        f"{record['samples_per_sec']:.0f} samples/s"
    )


def killed_worker(workers: list[ContainerState]) -> str | None:
    """A worker whose container was killed (exit status 137), which no rank lives to say: from the containers'
    states."""
    killed = [w.node for w in workers if not w.running and w.exit_code == 137]
    return f"{killed[0]}: its worker container was killed" if killed else None


def describe(
    rank0: ContainerState,
    job_status: str | None,
    workers: list[ContainerState],
    now: datetime | None = None,
    metrics: str | None = None,
    stall: str | None = None,
    restarts_made: str | None = None,
) -> str:
    """One line for `launcher status` from JOB_STATUS's record (once the job ended), the containers' states, the
    metrics file (None: there is none), JOB_STALL's and JOB_RESTARTS's records."""
    now = now or datetime.now(UTC)
    end = parse_job_end(job_status)
    restarted = end.last_restart() if end else restart.last_restart(restarts_made)
    restarts = f"; {restarted}" if restarted else ""
    if end is None:
        if rank0.running:
            record = StallRecord.from_json(stall)
            stalled = record.describe() if record else ""
            return f"running: {progress(metrics)}{f'; {stalled}' if stalled else ''}{restarts}"
        return f"failed: rank 0's container stopped (exit status {rank0.exit_code}) before the job ended" + _ago(
            rank0.finished_at, now
        )
    ended = _ago(rank0.finished_at, now)
    if end.succeeded:
        return f"succeeded (exit status 0): {progress(metrics)}{restarts}{ended}"
    cause = end.root_cause() or killed_worker(workers)
    return f"failed (exit status {end.status}){': ' + cause if cause else ''}{restarts}{ended}"
