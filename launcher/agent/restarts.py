"""The job agent's restarts (--max-restarts): after a run that failed, whether the job runs again and on which
workers (a spare in a lost worker's place, or the lost worker once its container started again), the restart said and
recorded, and the workers made ready for it; also the spares, claimed and checked before the first run. The
decisions themselves are pure, in launcher/core/restart.py; this module carries them out.
"""

from __future__ import annotations

import dataclasses

from launcher.agent.transport import Transport
from launcher.agent.workers import DISCOVERY_SSH_TIMEOUT, JobError, LostWorker, WorkerContact
from launcher.core import restart
from launcher.core.job import JobSpec, Worker
from launcher.core.protocol import JOB_RESTARTS, JobEnd

LEFTOVERS = "pkill -TERM -x orted; pkill -TERM -x prted; true"
"""Run on each worker a restart keeps: what is left of the ended run's Open MPI daemons (and their ranks) goes."""


class RestartingAgent(WorkerContact):
    """The agent's workers (WorkerContact) and the restarts of its job (the module's docstring)."""

    def __init__(self, spec: JobSpec, transport: Transport, **kwargs) -> None:
        super().__init__(spec, transport, **kwargs)
        self.run_losses: list[LostWorker] = []
        """The workers the last run lost (kept only for a job that may be restarted)."""
        self.ended_by: str | None = None
        """What ended the last run, when a watch did (its time limit, a stall): such a run is not restarted."""
        self.restarts: list[restart.Restart] = []
        self.script_restarts = 0
        """Restarts after a failure of the script itself (no node lost)."""
        self.spares_left: list[Worker] = list(spec.spares)
        """Spares no restart has used yet."""

    not_restarted = ""
    """Why the last run was not started again, when restarts were allowed and it failed."""

    def restart_on(self, end: JobEnd, ready: list[Worker]) -> list[Worker] | None:
        """After a run ended `end`: the workers to run the job again on, the restart said, recorded and prepared
        (self.spec is the restart's); None when the job ends as it is (and why, said)."""
        spec, options = self.spec, self.spec.options
        lost = self.run_losses
        why = restart.why_not(
            status=end.status,
            lost=[loss.name for loss in lost],
            ended_by=self.ended_by,
            stop_asked=self.transport.stop_asked(),
            restarts=len(self.restarts),
            script_restarts=self.script_restarts,
            max_restarts=options.max_restarts,
            say=options.spelling,
        )
        by_name = {worker.name: worker for worker in [*ready, *self.spares_left]}
        if why is None:
            spares = self.answering_spares(len(lost))
            world, unreplaced = restart.swap_in(
                [worker.name for worker in ready], [loss.name for loss in lost], [spare.name for spare in spares]
            )
            self.spares_left = [spare for spare in self.spares_left if spare.name not in world]
            waiting = [loss for loss in lost if loss.name in unreplaced]
            back = (
                self.wait_for_return(ready, waiting)
                if restart.must_wait(len(world), len(waiting), options.elastic_min_workers)
                else []
            )
            names, why = restart.world_after(
                world, unreplaced, [worker.name for worker in back], options.elastic_min_workers, options.spelling
            )
        if why is not None:
            if why:
                self.say(why)
            self.not_restarted = why
            return None
        workers = [by_name[name] for name in names]
        self.script_restarts += 0 if lost else 1
        reason = " and ".join(loss.reason() for loss in lost) or f"the script failed (exit status {end.status})"
        self.spec = dataclasses.replace(
            spec,
            restart=len(self.restarts) + 1,
            workers=tuple(workers) if spec.workers else (),
            expected_workers=len(workers),
        )
        done = restart.Restart(len(self.restarts) + 1, options.max_restarts, reason, tuple(names), *self.resume_point())
        self.restarts.append(done)
        self.say(done.line())
        records = "".join(item.record() for item in self.restarts)
        self.transport.write(JOB_RESTARTS, records)  # for `launcher status` while the job runs
        if self.spec.output_dir:
            self.transport.write(f"{self.spec.output_dir}/{restart.RECORDS_FILE}", records)
        for worker in workers:
            if worker.address != spec.agent_host and worker.address not in self.lost:
                self.transport.ssh(worker.address, LEFTOVERS, DISCOVERY_SSH_TIMEOUT)
        for worker in back:
            self.mark_lost(worker.address, None)
        self.claim(workers)
        self.check_command(workers)
        return workers

    def stand_by(self) -> None:
        """Every spare that answers is claimed and checked as the workers were, and stays out of the hostfile; one
        that does not answer yet is tried again when a restart needs it."""
        for spare in list(self.spares_left):
            if not self.answers(spare, DISCOVERY_SSH_TIMEOUT):
                self.say(f"{spare.name}: spare, does not answer yet; tried again when a restart needs it")
                continue
            self.claim([spare])
            try:
                self.check_command([spare])
            except JobError as error:
                self.spares_left.remove(spare)
                self.say(f"spare {error}; it will not be used")
                continue
            self.say(f"{spare.name}: spare, sshd answers; out of the hostfile until a restart needs it")

    def answering_spares(self, count: int) -> list[Worker]:
        """Up to `count` unused spares that answer now, in the order given."""
        found: list[Worker] = []
        for spare in self.spares_left:
            if len(found) < count and spare.address not in self.lost and self.answers(spare, DISCOVERY_SSH_TIMEOUT):
                found.append(spare)
        return found

    def wait_for_return(self, ready: list[Worker], lost: list[LostWorker]) -> list[Worker]:
        """The lost workers that answer again as new workers (their containers started again) within
        RESTART_WAIT_SECONDS; all of them, or as many as came back by then."""
        names = {loss.name for loss in lost}
        waiting = [worker for worker in ready if worker.name in names]
        self.say(
            f"waiting up to {restart.RESTART_WAIT_SECONDS} s for {', '.join(worker.name for worker in waiting)} to "
            "answer again"
        )
        back: list[Worker] = []
        deadline = self.clock() + restart.RESTART_WAIT_SECONDS
        while True:
            back += [
                worker
                for worker in waiting
                if worker not in back
                and self.answers(worker, DISCOVERY_SSH_TIMEOUT)
                and self.unclaimed_since_start(worker)
            ]
            if len(back) == len(waiting) or self.clock() > deadline or self.transport.stop_asked():
                return back
            self.sleep(1)

    def resume_point(self) -> tuple[int | None, str | None]:
        """Where a restart resumes: the bundled trainer's last checkpointed epoch (from its metrics), or the job's
        checkpoint folder for a script of the user's."""
        spec = self.spec
        if not spec.paths.trainer:
            return None, spec.checkpoint_dir
        metrics = spec.metrics_file if spec.checkpoint_dir else None
        epoch = restart.metrics_epoch(self.transport.read(metrics)) if metrics else None
        return epoch, spec.checkpoint_dir if epoch is not None else None
