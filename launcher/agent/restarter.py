"""The job agent's restarts (--max-restarts): after a run that failed, whether the job runs again and on which
workers (a spare in a lost worker's place, or the lost worker once its container started again), the restart said and
recorded, and the workers made ready for it; also the spares, claimed and checked before the first run. The decision
itself is pure (launcher/core/restart.py's decide: a RunResult in, Restart or NotRestarted out); this module gathers
what it needs (the spares that answer, the lost workers that came back) and carries it out.
"""

from __future__ import annotations

import dataclasses

from launcher.agent.workers import DISCOVERY_SSH_TIMEOUT, JobError, Workers
from launcher.core import restart
from launcher.core.jobspec import Worker
from launcher.core.protocol import JOB_RESTARTS
from launcher.core.runs import LostWorker, RunResult

LEFTOVERS = "pkill -TERM -x orted; pkill -TERM -x prted; true"
"""Run on each worker a restart keeps: what is left of the ended run's Open MPI daemons (and their ranks) goes."""


class Restarter:
    """The restarts of one job on its Workers (the module's docstring): those made so far, and the spares left."""

    def __init__(self, workers: Workers) -> None:
        self.workers = workers
        self._made: list[restart.Restart] = []
        self._spares_left: list[Worker] = list(workers.spec.spares)
        """Spares no restart has used yet."""

    def made(self) -> tuple[restart.Restart, ...]:
        """The restarts made so far, in order."""
        return tuple(self._made)

    def decide(self, run: RunResult, ready: list[Worker]) -> restart.Restart | restart.NotRestarted:
        """Whether the ended `run` on `ready` starts again, and on which workers (launcher/core/restart.py decides);
        asks the spares and waits for the lost workers only when the run may be restarted at all."""
        workers, options = self.workers, self.workers.spec.options
        refused = restart.refusal(
            run,
            stop_asked=workers.transport.stop_asked(),
            history=self._made,
            max_restarts=options.max_restarts,
            say=options.option_names,
        )
        if refused is not None:
            return refused
        names = [worker.name for worker in ready]
        lost = [loss.name for loss in run.lost]
        spares = [spare.name for spare in self.answering_spares(len(run.lost))]
        world, unreplaced = restart.swap_in(names, lost, spares)
        waiting = [loss for loss in run.lost if loss.name in unreplaced]
        back = (
            self.wait_for_return(ready, waiting)
            if restart.must_wait(len(world), len(waiting), options.elastic_min_workers)
            else []
        )
        return restart.decide(
            run,
            stop_asked=workers.transport.stop_asked(),
            history=self._made,
            max_restarts=options.max_restarts,
            workers=names,
            spares=spares,
            back=[worker.name for worker in back],
            min_workers=options.elastic_min_workers,
            resume=self.resume_point(),
            say=options.option_names,
        )

    def carry_out(self, done: restart.Restart, ready: list[Worker]) -> list[Worker]:
        """The restart `done` said, recorded and prepared: the job is now the restart's (its run number, its
        workers); returns the workers it runs on."""
        workers, spec = self.workers, self.workers.spec
        by_name = {worker.name: worker for worker in [*ready, *self._spares_left]}
        chosen = [by_name[name] for name in done.workers]
        self._spares_left = [spare for spare in self._spares_left if spare.name not in done.workers]
        workers.use(
            dataclasses.replace(
                spec,
                restart=done.number,
                workers=tuple(chosen) if spec.workers else (),
                expected_workers=len(chosen),
            )
        )
        self._made.append(done)
        workers.say(done.line())
        records = "".join(item.record() for item in self._made)
        workers.transport.write(JOB_RESTARTS, records)  # for `launcher status` while the job runs
        if spec.output_dir:
            workers.transport.write(f"{spec.output_dir}/{restart.RECORDS_FILE}", records)
        lost = workers.lost()
        for worker in chosen:
            if worker.address != spec.agent_host and worker.address not in lost:
                workers.transport.ssh(worker.address, LEFTOVERS, DISCOVERY_SSH_TIMEOUT)
        for worker in chosen:
            if worker.address in lost:  # a lost worker back as a new one
                workers.mark_lost(worker.address, None)
        workers.claim(chosen)
        workers.check_command(chosen)
        return chosen

    def stand_by(self) -> None:
        """Every spare that answers is claimed and checked as the workers were, and stays out of the hostfile; one
        that does not answer yet is tried again when a restart needs it."""
        workers = self.workers
        for spare in list(self._spares_left):
            if not workers.answers(spare, DISCOVERY_SSH_TIMEOUT):
                workers.say(f"{spare.name}: spare, does not answer yet; tried again when a restart needs it")
                continue
            workers.claim([spare])
            try:
                workers.check_command([spare])
            except JobError as error:
                self._spares_left.remove(spare)
                workers.say(f"spare {error}; it will not be used")
                continue
            workers.say(f"{spare.name}: spare, sshd answers; out of the hostfile until a restart needs it")

    def answering_spares(self, count: int) -> list[Worker]:
        """Up to `count` unused spares that answer now, in the order given."""
        workers = self.workers
        found: list[Worker] = []
        for spare in self._spares_left:
            if (
                len(found) < count
                and not workers.is_lost(spare.address)
                and workers.answers(spare, DISCOVERY_SSH_TIMEOUT)
            ):
                found.append(spare)
        return found

    def wait_for_return(self, ready: list[Worker], lost: list[LostWorker]) -> list[Worker]:
        """The lost workers that answer again as new workers (their containers started again) within
        RESTART_WAIT_SECONDS; all of them, or as many as came back by then."""
        workers = self.workers
        names = {loss.name for loss in lost}
        waiting = [worker for worker in ready if worker.name in names]
        workers.say(
            f"waiting up to {restart.RESTART_WAIT_SECONDS} s for {', '.join(worker.name for worker in waiting)} to "
            "answer again"
        )
        back: list[Worker] = []
        deadline = workers.clock() + restart.RESTART_WAIT_SECONDS
        while True:
            back += [
                worker
                for worker in waiting
                if worker not in back
                and workers.answers(worker, DISCOVERY_SSH_TIMEOUT)
                and workers.unclaimed_since_start(worker)
            ]
            if len(back) == len(waiting) or workers.clock() > deadline or workers.transport.stop_asked():
                return back
            workers.sleep(1)

    def resume_point(self) -> tuple[int | None, str | None]:
        """Where a restart resumes: the bundled trainer's last checkpointed epoch (from its metrics), or the job's
        checkpoint folder for a script of the user's."""
        spec = self.workers.spec
        if not spec.paths.trainer:
            return None, spec.checkpoint_dir
        metrics = spec.metrics_file if spec.checkpoint_dir else None
        epoch = restart.metrics_epoch(self.workers.transport.read(metrics)) if metrics else None
        return epoch, spec.checkpoint_dir if epoch is not None else None
