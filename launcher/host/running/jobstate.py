"""A cluster's job state, from what its containers hold: pure parsing, for `launcher status`.

Inputs are read through each node's engine (launcher/host/engines/node_engine.py): rank 0's container state, JOB_STATUS
and the tail of JOB_LOG, each worker's state, and the bundled trainer's metrics file in the cluster's run folder when
there is one; this module only decides what they mean and words it in one line.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from launcher.core import metrics, restart
from launcher.core.jobend import parse_job_end
from launcher.core.ranktag import untagged
from launcher.core.stall import StallRecord
from launcher.host.engines.node_engine import ContainerState

EPOCH_LINE = re.compile(r"epoch (\d+)/(\d+): .*val accuracy ([0-9.]+), ([0-9.]+) samples/s")
ERROR_LINE = re.compile(r"^(?:\S+ )*(?:\w+(?:Error|Exception)|error): .+")


def _ago(finished_at: str | None, now: datetime) -> str:
    if not finished_at or finished_at.startswith("0001-"):
        return ""
    stamp = datetime.fromisoformat(finished_at[:19]).replace(tzinfo=UTC)
    seconds = max(0, int((now - stamp).total_seconds()))
    return f", ended {seconds // 60} min {seconds % 60} s ago" if seconds >= 60 else f", ended {seconds} s ago"


def latest_record(metrics_text: str | None) -> dict | None:
    """The last complete record of a metrics file (a line being written as it is read is skipped)."""
    return metrics.last_record(metrics_text, ("epoch", "val_accuracy", "samples_per_sec"))


def progress(job_log: str, metrics_text: str | None = None) -> str:
    """'epoch 3 of 5, val accuracy 0.93, 6500 samples/s': the latest metrics record where the trainer writes one,
    else its last epoch line in the log (which also gives the planned epochs)."""
    matches = EPOCH_LINE.findall(job_log)
    record = latest_record(metrics_text)
    if record:
        of = f" of {matches[-1][1]}" if matches else ""
        return (
            f"epoch {record['epoch']}{of}, val accuracy {record['val_accuracy']:.4f}, "
            f"{record['samples_per_sec']:.0f} samples/s"
        )
    if not matches:
        return "no epoch finished yet"
    epoch, epochs, accuracy, rate = matches[-1]
    return f"epoch {epoch} of {epochs}, val accuracy {float(accuracy):.4f}, {float(rate):.0f} samples/s"


def root_cause(job_log: str, workers: list[ContainerState]) -> str:
    """The one line that says why a job failed, when it can be told; each line read as its rank wrote it (its rank
    tag off)."""
    killed = [w.node for w in workers if not w.running and w.exit_code == 137]
    if killed:
        return f"{killed[0]}: its worker container was killed"
    said = (untagged(line).strip() for line in job_log.splitlines())
    errors = [line for line in said if ERROR_LINE.match(line)]
    # When one rank raises, the others then fail because Horovod shut down: the first other error is the cause.
    causes = [line for line in errors if "has been shut down" not in line]
    return (causes or errors or [""])[0]


def describe(
    rank0: ContainerState,
    job_status: str | None,
    job_log: str,
    workers: list[ContainerState],
    now: datetime | None = None,
    metrics: str | None = None,
    stall: str | None = None,
    restarts_made: str | None = None,
) -> str:
    """One line for `launcher status` from JOB_STATUS's record (once the job ended), the tail of JOB_LOG (the last
    epoch, the ranks' errors), the containers' states, the metrics file, JOB_STALL's and JOB_RESTARTS's records."""
    now = now or datetime.now(UTC)
    end = parse_job_end(job_status)
    restarted = end.last_restart() if end else restart.last_restart(restarts_made)
    restarts = f"; {restarted}" if restarted else ""
    if end is None:
        if rank0.running:
            record = StallRecord.from_json(stall)
            stalled = record.describe() if record else ""
            return f"running: {progress(job_log, metrics)}{f'; {stalled}' if stalled else ''}{restarts}"
        return f"failed: rank 0's container stopped (exit status {rank0.exit_code}) before the job ended" + _ago(
            rank0.finished_at, now
        )
    ended = _ago(rank0.finished_at, now)
    if end.succeeded:
        return f"succeeded (exit status 0): {progress(job_log, metrics)}{restarts}{ended}"
    cause = end.root_cause() or root_cause(job_log, workers)
    return f"failed (exit status {end.status}){': ' + cause if cause else ''}{restarts}{ended}"
