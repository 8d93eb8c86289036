"""The job agent: owns one job from inside the rank-0 container (or compose's launcher container, or an MPIJob's
launcher pod), however the job was launched.

One job, in order (Agent.run): ssh client set-up (for compose also the cluster's key pair) -> readiness: every
worker's published host key pinned and its sshd answering -> an ssh connection to every worker -> a check that every
worker can start the command -> the hostfile and mpirun (or elastic horovodrun) -> its exit status and root cause
-> every worker told that the job ended. While it runs, a connection watch notices a worker that is lost (its container
stopped, or silent: link down, host down, powered off) and ends a fixed-size job at once or drops the worker from an
elastic one; a stall watch notices a job that prints nothing and records no new metrics for the stall timeout, and
gathers every rank's stack once (launcher/core/stall.py, launcher/agent/stacks.py). The job's life is the cluster's:
it does not depend on the client that started it, and when the agent itself dies (its container killed, out of
memory, a reboot) its connections close and every worker stops by itself.

The agent is a loop that passes values (the shape of torchrun's elastic agent): each run returns a RunResult
(launcher/core/runs.py: its state, exit status, cause, lost workers), the pure restart decision turns it into a
Restart or a NotRestarted (launcher/core/restart.py), and the job's end is a JobEnd carrying those records
(launcher/core/jobend.py), which the host renders. Its parts, each in its own module: the Workers service (finding and
trusting them, their connections, the lost ones, their stacks, the last word: launcher/agent/workers.py), the
restarts (launcher/agent/restarter.py), the watches beside the running job (launcher/agent/watches.py), the failed
rank's error record (launcher/agent/rank_errors.py) and Horovod's records summarised at the end
(launcher/agent/records.py). Side effects go through a Transport
(launcher/agent/transport.py), so every decision here is tested without containers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from launcher.agent import rank_errors, records, watches
from launcher.agent.restarter import Restarter
from launcher.agent.transport import Transport
from launcher.agent.workers import JobError, LostWorker, Say, Scan, Workers, say
from launcher.core import legacy_keras
from launcher.core.jobend import JobEnd
from launcher.core.jobspec import JobSpec, Worker, hostfile, ssh_config
from launcher.core.protocol import (
    HOME,
    HOSTFILE_PATH,
    JOB_LOG,
    JOB_PRIVATE_FILES,
    JOB_STATUS,
    KEEP_RUNNING,
    KEPT_JOB_LOG,
    KNOWN_HOSTS,
    SSH_CONFIG,
    Signalled,
)
from launcher.core.ranks import placement_line
from launcher.core.restart import NotRestarted, Restart
from launcher.core.runs import RunResult, RunState

REFUSED_JOB_PATIENCE_SECONDS = 30
"""How long a job refused before it started keeps trying to tell the workers (they may still be starting)."""


class Agent:
    """One job, readiness -> run (and its restarts) -> end (the module's docstring). `scan`: learn the workers' host
    keys at first contact (launcher/agent/hostkeys.py); `setup`: what the launch method adds to the ssh client's set-up
    (an MPIJob's: the operator's key)."""

    def __init__(
        self,
        spec: JobSpec,
        transport: Transport,
        say: Say = say,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        scan: Scan | None = None,
        setup: Callable[[Transport], None] | None = None,
    ) -> None:
        self.workers = Workers(spec, transport, say, clock, sleep, scan)
        self.restarter = Restarter(self.workers)
        self.transport, self.say, self.clock, self.sleep, self.setup = transport, say, clock, sleep, setup
        self.job_started: float | None = None
        """When the job's first run started (its time limit counts from then, restarts included)."""

    @property
    def spec(self) -> JobSpec:
        """The job as it runs now (a restart's spec once it restarted)."""
        return self.workers.spec

    def run(self) -> JobEnd:
        """The whole job; however it ends, its status is recorded and every worker is told."""
        ready: list[Worker] = []
        try:
            self.prepare()
            secrets = self.secrets()  # first: the file goes, whatever happens next
            ready = self.wait_until_ready()
            self.workers.claim(ready)
            self.workers.check_command(ready)
            self.restarter.stand_by()
            result = self.run_job(ready, secrets)
            while isinstance(decision := self.restarter.decide(result, ready), Restart):
                ready = self.restarter.carry_out(decision, ready)
                result = self.run_job(ready, secrets)
            end = self.ended(result, decision)
        except JobError as error:
            self.say(f"error: {error}")
            end = JobEnd(2, str(error))
        except Signalled as stop:  # before the job ran; once it runs, the signal goes to it
            end = JobEnd(128 + stop.signum, f"the job's agent was stopped ({stop}) before the job ended")
            self.say(f"error: {end.cause}")
        except Exception as error:  # noqa: BLE001  a bug of ours still ends the job, every worker told
            end = JobEnd(70, f"the job's agent failed: {type(error).__name__}: {error}")
            self.say(f"error: {end.cause}")
        self.finish(end, self.workers_to_tell(ready))
        return end

    def ended(self, result: RunResult, decision: NotRestarted) -> JobEnd:
        """The job's end after its last run: the decision not to start it again is said, when there is a reason."""
        if decision.reason:
            self.say(decision.reason)
        return JobEnd.of_run(result, self.restarter.made(), decision)

    # --- readiness -----------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        if self.spec.make_key:
            self.transport.make_cluster_key()
        self.transport.write(SSH_CONFIG, ssh_config(self.spec.options.ssh_port), 0o600)
        self.transport.write(KNOWN_HOSTS, "", 0o600)  # pins are per job: a worker's key is new in every container
        if self.spec.output_dir:
            self.transport.make_run_dir(self.spec.output_dir)
        if self.setup is not None:
            self.setup(self.transport)

    def wait_until_ready(self) -> list[Worker]:
        """The job's workers once every one's sshd answers, in the candidates' order (rank 0's node first)."""
        spec = self.spec
        deadline = self.clock() + spec.options.ready_timeout
        ready: list[Worker] = []
        while True:
            candidates = self.workers.candidates()
            for worker in candidates:
                if worker not in ready and self.workers.answers(worker):
                    ready.append(worker)
                    self.say(
                        f"{worker.name}: sshd answers on port {spec.options.ssh_port} ({len(ready)}/"
                        f"{spec.expected_workers} workers answer over ssh)"
                    )
            if len(ready) >= spec.expected_workers:
                order = {worker: index for index, worker in enumerate(candidates)}
                return sorted(ready, key=lambda worker: order.get(worker, len(order)))[: spec.expected_workers]
            if self.clock() > deadline:
                waiting = [worker.name for worker in candidates if worker not in ready]
                raise JobError(
                    f"only {len(ready)} of {spec.expected_workers} workers answered ssh on port "
                    f"{spec.options.ssh_port} within {spec.options.ready_timeout:.0f} s (still waiting for "
                    f"{', '.join(waiting) or 'workers that do not resolve yet'}); {spec.words.workers_fix}"
                )
            self.sleep(1)

    def secrets(self) -> dict[str, str]:
        """The job's secret settings, or one JobError naming those that did not arrive."""
        names = self.spec.options.secrets
        found = self.transport.take_secrets(names) if names else {}
        missing = [name for name in names if name not in found]
        if missing:
            raise JobError(
                f"the secret setting(s) {', '.join(missing)} did not reach the job's agent: start the job again with "
                f"{self.spec.options.option_names.of('secrets')} and the value in the launching machine's environment"
            )
        return found

    # --- the run -------------------------------------------------------------------------------------------------
    def run_job(self, ready: list[Worker], secrets: dict[str, str] | None = None) -> RunResult:
        """mpirun (or elastic horovodrun) over the ready workers, `secrets` in its environment; how it ended."""
        spec, workers = self.spec, self.workers
        argv = spec.job_argv()
        workers.start_run(ready)
        self.transport.write(HOSTFILE_PATH, hostfile(ready, spec.slots))
        self.say(f"hostfile: {' '.join(f'{worker.address}:{spec.slots_of(worker)}' for worker in ready)}")
        if not spec.elastic:  # an elastic job's ranks move with each reset; horovodrun places them
            self.say(placement_line([(worker.name, spec.slots_of(worker)) for worker in ready]))
        self.say(f"running: {' '.join(argv)}")
        claims = watches.ElasticClaims(workers) if spec.elastic else None
        lifelines = watches.LifelineWatch(workers)
        stall = watches.StallWatch(workers, ready) if spec.options.stall_timeout > 0 else None
        if self.job_started is None:
            self.job_started = self.clock()
        used = self.clock() - self.job_started  # a restart's run has what its earlier runs left of the limit
        limit = (
            watches.TimeLimit(workers, ready, spec.options.time_limit - used) if spec.options.time_limit > 0 else None
        )
        threads = [thread for thread in (claims, lifelines, stall, limit) if thread]
        for thread in threads:
            thread.start()
        try:
            status = self.transport.run(argv, cwd=HOME, env=secrets)
        finally:
            for thread in threads:
                thread.stop()
        self.say(f"{spec.program} exited with status {status}")
        if limit and limit.cause:
            return RunResult(RunState.TIMED_OUT, watches.TimeLimit.STATUS, limit.cause)
        if lifelines.cause:
            # Who was lost, exactly, only where a restart needs it (asking each worker takes a while).
            lost = workers.losses(ready) if spec.options.can_restart else sorted(workers.lost().values(), key=str)
            state = RunState.WORKERS_LOST if lost else RunState.FAILED
            return RunResult(state, status or 1, lifelines.cause, tuple(lost))
        if stall and stall.cause:
            return RunResult(RunState.STALLED, status or 1, stall.cause)
        if status == 0:
            return RunResult(RunState.SUCCEEDED, 0)
        losses = workers.losses(ready)
        if losses:
            return RunResult(RunState.WORKERS_LOST, status, self.cause_of(losses), tuple(losses))
        rank, cause = self.rank_cause(ready)
        return RunResult(RunState.FAILED, status, cause, failed_rank=rank)

    def cause_of(self, losses: list[LostWorker]) -> str | None:
        """The failed job's cause, when it lost workers."""
        spec = self.spec
        if not losses:
            return None
        hint = spec.words.lost_hint
        if spec.elastic:
            return f"{spec.options.fell_below(', '.join(loss.short() for loss in losses))}; {hint}"
        silent = [str(loss) for loss in losses if loss.silent]
        closed = [loss.name for loss in losses if not loss.silent]
        return "; ".join([*silent, *([f"{', '.join(closed)}: worker lost during the run; {hint}"] if closed else [])])

    def rank_cause(self, ready: list[Worker]) -> tuple[int | None, str | None]:
        """The failed rank and the job's cause, said: `rank 1 on node_2: RuntimeError: ...` from the record of the
        rank whose error ended the run (launcher/agent/rank_errors.py), or, where its output shows an error the stack
        words with its fix, that: Keras 2 code on Keras 3 (launcher/core/legacy_keras.py). None, None: no rank
        said why (one killed by a signal, a program that writes no record)."""
        spec, record = self.spec, self.transport.rank_error()
        keras2 = self.transport.keras2_rank()
        rank = keras2 if keras2 is not None else record.rank if record else None
        if rank is None:
            return None, None
        slots = None if spec.elastic else [spec.slots_of(worker) for worker in ready]
        node = rank_errors.node_of(record.node if record else "", rank, ready, slots)
        if keras2 is not None:
            options = spec.options
            error = legacy_keras.explained(legacy_keras.ERROR, options.launch_method, options.command)
        else:
            assert record is not None
            error = record.error()
        cause = f"rank {rank}{f' on {node}' if node else ''}: {error}"
        self.say(f"error: {cause}")
        return rank, cause

    def refuse(self, cause: str) -> JobEnd:
        """A job refused before it started (a bad setting): the workers that are up are told all the same."""
        self.say(f"error: {cause}")
        end = JobEnd(2, cause)
        self.prepare()
        self.finish(end, self.workers.candidates(), patience=REFUSED_JOB_PATIENCE_SECONDS)
        return end

    # --- the end -----------------------------------------------------------------------------------------------
    def workers_to_tell(self, ready: list[Worker]) -> list[Worker]:
        everyone = [*ready, *self.workers.candidates(), *self.workers.claimed(), *self.spec.spares]
        known = {worker.address: worker for worker in everyone}
        return list(known.values())

    def finish(self, end: JobEnd, workers: list[Worker], patience: float = 0) -> None:
        spec = self.spec
        outcome = "succeeded" if end.succeeded else "FAILED"
        stays = "the workers keep running (--keep-running)" if spec.keep_running else "the workers stop now"
        self.say(f"job {outcome} (exit status {end.status}); {stays}")
        records.horovod_records(spec, self.transport, self.say)
        if spec.run_dir:
            where = f" in {spec.results_hint}" if spec.results_hint else ""
            self.say(f"results: {spec.run_dir} (metrics.jsonl, curves.png, tb/, checkpoints/){where}")
        elif spec.output_dir:
            where = f" in {spec.results_hint}" if spec.results_hint else ""
            self.say(f"results: {spec.output_dir} (Horovod's records){where}")
        elif spec.results_hint:
            self.say(f"results: {spec.results_hint}")
        self.keep_output()
        self.transport.write(JOB_STATUS, end.to_json() + "\n")
        self.wind_down(end, workers, patience)

    def keep_output(self) -> None:
        """The job's whole output (JOB_LOG, where the multi-host launcher keeps it) into its run folder: the containers
        and their logs go when the job ends, the shared folder stays."""
        folder = self.spec.run_folder
        output = self.transport.read(JOB_LOG) if folder else None
        if output is not None:
            self.transport.write(f"{folder}/{KEPT_JOB_LOG}", output)

    def wind_down(self, end: JobEnd, workers: list[Worker], patience: float = 0) -> None:
        """Tells every worker the job ended, then removes the job's private files (the cluster's key, the secrets, the
        job spec; not with --keep-running, whose containers stay up for debugging). The worker whose container runs
        this agent (the launcher's rank 0) hears last, over its open connection: it stops soon after, and this agent
        with it."""
        message = KEEP_RUNNING if self.spec.keep_running else end.to_json()
        own = self.spec.agent_host
        self.workers.tell_all([worker for worker in workers if worker.address != own], message, patience)
        if not self.spec.keep_running:  # a stopped container stays until `launcher stop`: nothing secret in it
            for path in JOB_PRIVATE_FILES:
                self.transport.remove(path)
        if own is not None:
            self.workers.tell_all(
                [worker for worker in workers if worker.address == own] or [Worker(own, own)], message
            )
