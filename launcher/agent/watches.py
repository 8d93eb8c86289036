"""The watches beside a running job, each a thread that run_job (launcher/agent/job.py) starts with the job and
stops once it ends: ElasticClaims (an elastic job's joining and returning workers claimed), LifelineWatch (a worker
lost: the job ended, or an elastic one goes on without it), StallWatch (a job that shows no progress: every rank's
stack, once) and TimeLimit (the job ended at its time limit). Each works through the job's Workers service
(launcher/agent/workers.py); a watch that ends the job says why (its cause, which run_job reads once it stopped it).
"""

from __future__ import annotations

import threading

from launcher.agent.workers import DISCOVERY_SSH_TIMEOUT, Workers
from launcher.core import stall
from launcher.core.jobspec import Worker
from launcher.core.protocol import JOB_STALL

ELASTIC_CLAIM_INTERVAL = 2
LIFELINE_POLL_SECONDS = 1
ELASTIC_RECOVERY_GRACE_SECONDS = 30
"""An elastic job that lost a worker and then shows no progress for its elastic timeout and this long has not
recovered (Horovod's driver could not go on without the worker, nor fail by itself): the agent ends it."""


class JobWatch(threading.Thread):
    """A thread beside the running job (run_job starts and stops them all): `done` ends it; `cause` is why it ended
    the job, when it did."""

    def __init__(self, workers: Workers, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.workers = workers
        self.done = threading.Event()
        self._cause: str | None = None

    @property
    def cause(self) -> str | None:
        """Why this watch ended the job; None when it did not."""
        return self._cause

    def end_job(self, cause: str, said: str) -> None:
        """Ends the job with `cause`, unless it ended by itself meanwhile (its end stands)."""
        if self.workers.transport.stop_job():
            self._cause = cause
            self.workers.say(said)

    def stop(self) -> None:
        self.done.set()
        self.join()  # before the wind-down reads the connections and the causes


class ElasticClaims(JobWatch):
    """During an elastic job: an ssh connection to every worker that joins or comes back (discovery lets it in)."""

    def __init__(self, workers: Workers) -> None:
        super().__init__(workers, "elastic-claims")
        self.returns: dict[str, int] = {}
        """How often each lost worker came back (with --restart-workers, its node's engine started it again)."""

    def run(self) -> None:
        while not self.done.wait(ELASTIC_CLAIM_INTERVAL):
            try:
                self.claim_round()
            except Exception as error:  # noqa: BLE001  the job goes on; a later round tries again
                self.workers.say(f"could not claim a returning worker: {error}")

    def claim_round(self) -> None:
        """One round: every candidate without a live connection that answers is claimed, unless it is a lost worker's
        old container (a lost worker comes back only as a new one, its container started again; the old one stops)."""
        workers = self.workers
        joining = [
            worker
            for worker in workers.unclaimed()
            if workers.answers(worker, DISCOVERY_SSH_TIMEOUT)
            and (not workers.is_lost(worker.address) or workers.unclaimed_since_start(worker))
        ]
        workers.claim(joining)
        options = workers.spec.options
        for worker in joining:
            if workers.is_lost(worker.address):
                workers.mark_lost(worker.address, None)
                self.returns[worker.name] = count = self.returns.get(worker.name, 0) + 1
                restarted = (
                    f" (its engine's restart {count} of at most {options.worker_restarts}, --worker-restarts)"
                    if options.restart_workers
                    else ""
                )
                workers.say(f"{worker.name}: a new worker there is claimed; host discovery lists it again{restarted}")


class LifelineWatch(JobWatch):
    """While the job runs: the agent's ssh connection to every claimed worker. A worker whose connection closes is
    lost: its container stopped or was killed, or it went silent (no answer for SILENCE_SECONDS: link down, host down
    or powered off). A fixed-size job cannot go on without it, and its ranks would wait in a collective that never
    completes: the job is ended at once, the loss its cause. An elastic job goes on without it: host discovery stops
    listing it (JOB_LOST); should the job then show no progress for its elastic timeout and
    ELASTIC_RECOVERY_GRACE_SECONDS (Horovod neither went on nor failed), it is ended, the loss its cause."""

    def __init__(self, workers: Workers) -> None:
        super().__init__(workers, "connection-watch")
        self.last_loss: float | None = None

    def run(self) -> None:
        while self.cause is None and not self.done.wait(LIFELINE_POLL_SECONDS):
            try:
                self.check()
            except Exception as error:  # noqa: BLE001  the job goes on; the next round looks again
                self.workers.say(f"connection watch: {type(error).__name__}: {error}")

    def check(self) -> None:
        workers = self.workers
        for address, loss in workers.newly_closed():
            workers.mark_lost(address, loss)
            if not workers.spec.elastic and not workers.runs_on(address):  # a spare: the job goes on
                workers.say(f"{loss}; a spare, not used by any restart")
                continue
            self.last_loss = workers.clock()
            if not workers.spec.elastic:
                self.end_job(str(loss), f"error: {loss}; ending the job")
                return
            workers.say(f"{loss}; host discovery drops it and the elastic job goes on without it")
        lost = workers.lost()
        if workers.spec.elastic and lost and self.last_loss is not None:
            patience = workers.spec.options.elastic_timeout + ELASTIC_RECOVERY_GRACE_SECONDS
            if workers.clock() - self.last_loss > patience and workers.transport.output_age() > patience:
                cause = (
                    f"the elastic job showed no progress for {patience} s after it lost "
                    f"{', '.join(loss.short() for loss in lost.values())}"
                )
                self.end_job(cause, f"error: {cause}; ending the job")


class StallWatch(JobWatch):
    """While the job runs: when it prints nothing and records no new metrics for the stall timeout, every rank's
    stack goes into the job's log once, and JOB_STALL says so for `launcher status` (also Horovod's own stall
    warnings); with the stall action `fail`, the job is ended with the stall as its cause."""

    def __init__(self, workers: Workers, ready: list[Worker]) -> None:
        super().__init__(workers, "stall-watch")
        self.ready = ready

    def run(self) -> None:
        spec, transport = self.workers.spec, self.workers.transport
        metrics = spec.metrics_file
        where = ""
        written: stall.StallRecord | None = None  # the first round writes even an empty one: a former run's is over

        def publish(record: stall.StallRecord) -> None:
            nonlocal written
            if record != written:  # None at first
                transport.write(JOB_STALL, record.to_json() + "\n")
                written = record

        while not self.done.wait(stall.poll_seconds(spec.options.stall_timeout)):
            try:
                idle = stall.idle_seconds(transport.output_age(), transport.file_age(metrics) if metrics else None)
                if not stall.is_stalled(idle, spec.options.stall_timeout):
                    if where and written:  # the stall's length as last written: idle starts over with new output
                        self.workers.say(
                            f"the job shows progress again after a stall of {written.idle_seconds} s or more"
                        )
                    where = ""
                elif not where:
                    # Said at once: taking every rank's stack can take a while on a busy node, and `launcher status`
                    # should not wait for it to say that the job stalled.
                    publish(stall.StallRecord(int(idle), "", transport.horovod_warning()))
                    where = self.stalled(idle) or "no rank's stack could be taken"
                publish(stall.StallRecord(int(idle) if where else 0, where, transport.horovod_warning()))
            except Exception as error:  # noqa: BLE001  the job goes on; the next round tries again
                self.workers.say(f"stall watch: {type(error).__name__}: {error}")

    def stalled(self, idle: float) -> str:
        spec = self.workers.spec
        where = self.workers.report_stacks(self.ready, stall.notice(idle, spec.options.stall_timeout))
        if spec.options.stall_action == "fail":
            cause = stall.cause(idle, where)
            self.end_job(cause, stall.ending(cause))
        return where


class TimeLimit(JobWatch):
    """The job's time limit: once the job has run that long, every rank's stack goes into the job's log and the job
    is ended (as timeout(1) ends a command: exit status 124), with the limit and where the ranks were as its cause."""

    STATUS = 124

    def __init__(self, workers: Workers, ready: list[Worker], seconds: float) -> None:
        super().__init__(workers, "time-limit")
        self.ready, self.seconds = ready, seconds
        """What is left of the limit (all of it in the first run)."""

    def run(self) -> None:
        limit = self.workers.spec.options.time_limit
        if self.done.wait(max(0.0, self.seconds)):
            return
        where = self.workers.report_stacks(self.ready, f"the job ran past its time limit of {limit} s")
        cause = f"the job ran past its time limit of {limit} s; {where or 'no stacks'}"
        self.end_job(cause, f"error: {cause}; ending the job")
