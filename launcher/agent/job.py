"""The job agent: owns one job from inside the rank-0 container (or compose's launcher container, or an MPIJob's
launcher pod), whichever door started it.

One job, in order (Agent.run): ssh client set-up (for compose also the cluster's key pair) -> readiness: every
worker's published host key pinned and its sshd answering -> a lifeline to every worker -> a check that every
worker can start the command -> the hostfile and mpirun (or elastic horovodrun) -> its exit status and root cause
-> every worker told that the job ended. While it runs, a lifeline watch notices a worker that is lost (its container
stopped, or silent: link down, host down, powered off) and ends a fixed-size job at once or drops the worker from an
elastic one; a stall watch notices a job that prints nothing and records no new metrics for the stall timeout, and
gathers every rank's stack once (launcher/core/stall.py, launcher/agent/stacks.py). The job's life is the cluster's:
it does not depend on the client that started it, and when the agent itself dies (its container killed, out of
memory, a reboot) its lifelines close and every worker stops by itself.

Side effects go through a Transport (launcher/agent/transport.py), so every decision here is tested without
containers.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from app import autotune, timeline
from launcher.agent import stacks
from launcher.agent.transport import Lifeline, Transport
from launcher.core import restart, stall
from launcher.core.job import JobSpec, Worker, command_probe, hostfile, pin_known_host, ssh_config, trainer_option
from launcher.core.options import names_in
from launcher.core.protocol import (
    AGENT,
    HOME,
    HOSTFILE_PATH,
    HOSTKEYS_DIR,
    JOB_LOG,
    JOB_LOST,
    JOB_PRIVATE_FILES,
    JOB_STALL,
    JOB_STATUS,
    KEEP_RUNNING,
    KEEPALIVE_INTERVAL_SECONDS,
    KEPT_JOB_LOG,
    KNOWN_HOSTS,
    SILENCE_SECONDS,
    SSH_CONFIG,
    SSH_CONNECT_TIMEOUT_SECONDS,
    STACKS,
    WORKER_CLAIMED,
    JobEnd,
    Signalled,
    agent_line,
)
from launcher.core.ranks import placement_line

DISCOVERY_SSH_TIMEOUT = 2
REFUSED_JOB_PATIENCE_SECONDS = 30
"""How long a job refused before it started keeps trying to tell the workers (they may still be starting)."""
ELASTIC_CLAIM_INTERVAL = 2
STALL_POLL_SECONDS = 5
LIFELINE_POLL_SECONDS = 1
ELASTIC_RECOVERY_GRACE_SECONDS = 30
TIMELINE_SUMMARY_BYTES = 256 << 20
"""A timeline larger than this is named but not summarised at the job's end (its parse would take the agent's
memory and minutes)."""
"""An elastic job that lost a worker and then shows no progress for its elastic timeout and this long has not
recovered (Horovod's driver could not go on without the worker, nor fail by itself): the agent ends it."""

Say = Callable[[str], None]


def say(message: str) -> None:
    print(agent_line(time.strftime("%H:%M:%S"), message), flush=True)


class JobError(RuntimeError):
    """The job could not run, or failed for a reason the agent can name; one line naming the fix."""


def lifeline_command(driver: str) -> str:
    return shlex.join([*AGENT, "lifeline", "--driver", driver])


@dataclass(frozen=True)
class LostWorker:
    """A worker lost during the run: its lifeline closed (its container stopped or was killed), or it went silent."""

    name: str
    silent: bool

    def __str__(self) -> str:
        if self.silent:
            return f"{self.name} went silent (no answer for {SILENCE_SECONDS} s: link down, host down or powered off)"
        return f"{self.name}: worker lost during the run"

    def short(self) -> str:
        """As one of a list of lost workers."""
        return f"{self.name} (silent for {SILENCE_SECONDS} s)" if self.silent else self.name

    def reason(self) -> str:
        """As the reason for a restart."""
        return f"{self.name} went silent" if self.silent else f"{self.name}'s worker was lost"


LEFTOVERS = "pkill -TERM -x orted; pkill -TERM -x prted; true"
"""Run on each worker a restart keeps: what is left of the ended run's Open MPI daemons (and their ranks) goes."""


def lost_addresses(text: str | None) -> set[str]:
    """The addresses in JOB_LOST."""
    return set((text or "").split())


class Agent:
    def __init__(
        self,
        spec: JobSpec,
        transport: Transport,
        say: Say = say,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.spec, self.transport, self.say, self.clock, self.sleep = spec, transport, say, clock, sleep
        self.lifelines: dict[str, Lifeline] = {}
        """Open lifelines, by worker address."""
        self.claimed: dict[str, Worker] = {}
        """Every worker a lifeline was opened to, by address."""
        self.lost: dict[str, LostWorker] = {}
        """Workers lost during the run and not claimed again, by address."""
        self.run_losses: list[LostWorker] = []
        """The workers the last run lost (kept only for a job that may be restarted)."""
        self.ended_by: str | None = None
        """What ended the last run, when a watch did (its time limit, a stall): such a run is not restarted."""
        self.restarts: list[restart.Restart] = []
        self.script_restarts = 0
        """Restarts after a failure of the script itself (no node lost)."""
        self.running: set[str] = set()
        """The addresses of the workers the job runs on now (not a spare's)."""
        self.spares_left: list[Worker] = list(spec.spares)
        """Spares no restart has used yet."""
        self.job_started: float | None = None
        """When the job's first run started (its time limit counts from then, restarts included)."""

    # --- finding and trusting workers ----------------------------------------------------------------------------
    def candidates(self) -> list[Worker]:
        """The workers this job may use right now: the launcher's fixed list, or what the service name resolves to."""
        if self.spec.workers:
            return list(self.spec.workers)
        if self.spec.worker_service:
            return [Worker(address, address) for address in self.transport.resolve(self.spec.worker_service)]
        return []

    def pin(self, worker: Worker) -> bool:
        """Pins the host key the worker published (read from the cluster's files, never trusted over the network);
        False while it has published none."""
        key = self.transport.read(f"{HOSTKEYS_DIR}/{worker.address}.pub")
        if not key or len(key.split()) < 2:
            return False
        known = self.transport.read(KNOWN_HOSTS) or ""
        updated = pin_known_host(known, worker.address, self.spec.options.ssh_port, key)
        if updated != known:
            self.transport.write(KNOWN_HOSTS, updated, 0o600)
        return True

    def answers(self, worker: Worker, timeout: float = SSH_CONNECT_TIMEOUT_SECONDS) -> bool:
        return self.pin(worker) and self.transport.ssh(worker.address, "true", timeout)[0] == 0

    def prepare(self) -> None:
        if self.spec.make_key:
            self.transport.make_cluster_key()
        self.transport.write(SSH_CONFIG, ssh_config(self.spec.options.ssh_port), 0o600)
        self.transport.write(KNOWN_HOSTS, "", 0o600)  # pins are per job: a worker's key is new in every container
        if self.spec.output_dir:
            self.transport.make_run_dir(self.spec.output_dir)

    def wait_until_ready(self) -> list[Worker]:
        """The job's workers once every one's sshd answers, in the candidates' order (rank 0's node first)."""
        spec = self.spec
        deadline = self.clock() + spec.options.ready_timeout
        ready: list[Worker] = []
        while True:
            candidates = self.candidates()
            for worker in candidates:
                if worker not in ready and self.answers(worker):
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

    def claim(self, workers: list[Worker]) -> None:
        """A lifeline to every worker that has none open: it ends when the job ends, or when this agent dies."""
        for worker in workers:
            line = self.lifelines.get(worker.address)
            if line is None or not line.alive():
                self.lifelines[worker.address] = self.transport.lifeline(
                    worker.address, lifeline_command(self.spec.driver)
                )
                self.claimed[worker.address] = worker

    def unclaimed_since_start(self, worker: Worker) -> bool:
        """The worker has never been claimed since its container started: a new worker, not a lost one that came
        back (that one stops by itself once it notices its lifeline closed)."""
        return self.transport.ssh(worker.address, f"test ! -e {WORKER_CLAIMED}", DISCOVERY_SSH_TIMEOUT)[0] == 0

    def mark_lost(self, address: str, loss: LostWorker | None) -> None:
        """Records a worker as lost or, with None, claimed again; JOB_LOST tells host discovery."""
        if loss is None:
            self.lost.pop(address, None)
        else:
            self.lost[address] = loss
        if self.spec.elastic:
            self.transport.write(JOB_LOST, "".join(f"{lost}\n" for lost in sorted(self.lost)))

    # --- the job -----------------------------------------------------------------------------------------------
    def check_command(self, workers: list[Worker]) -> None:
        """Every worker can start the command, or one line naming the worker and the fix, before mpirun."""
        spec = self.spec
        probe = f"cd {shlex.quote(spec.cwd)} && {shlex.join(command_probe(spec.command))}"
        for worker in workers:
            code, output = self.transport.ssh(worker.address, probe, SSH_CONNECT_TIMEOUT_SECONDS + 20)
            if code != 0:
                why = (output.strip().splitlines() or [f"exit status {code}"])[-1]
                raise JobError(
                    f"{worker.name}: cannot start `{' '.join(spec.command)}` in {spec.cwd}: {why}; "
                    f"{spec.words.command_fix}"
                )

    def secrets(self) -> dict[str, str]:
        """The job's secret settings, or one JobError naming those that did not arrive."""
        names = self.spec.options.secrets
        found = self.transport.take_secrets(names) if names else {}
        missing = [name for name in names if name not in found]
        if missing:
            raise JobError(
                f"the secret setting(s) {', '.join(missing)} did not reach the job's agent: start the job again with "
                f"{self.spec.options.spelling.of('secrets')} and the value in the launching machine's environment"
            )
        return found

    def run_job(self, ready: list[Worker], secrets: dict[str, str] | None = None) -> JobEnd:
        """mpirun (or elastic horovodrun) over the ready workers, `secrets` in its environment; how it ended."""
        spec = self.spec
        argv = spec.job_argv()
        self.running = {worker.address for worker in ready}
        self.transport.write(HOSTFILE_PATH, hostfile(ready, spec.slots))
        self.say(f"hostfile: {' '.join(f'{worker.address}:{spec.slots_of(worker)}' for worker in ready)}")
        if not spec.elastic:  # an elastic job's ranks move with each reset; horovodrun places them
            self.say(placement_line([(worker.name, spec.slots_of(worker)) for worker in ready]))
        self.say(f"running: {' '.join(argv)}")
        watch = ElasticClaims(self) if spec.elastic else None
        lifelines = LifelineWatch(self)
        stall = StallWatch(self, ready) if spec.options.stall_timeout > 0 else None
        if self.job_started is None:
            self.job_started = self.clock()
        used = self.clock() - self.job_started  # a restart's run has what its earlier runs left of the limit
        limit = TimeLimit(self, ready, spec.options.time_limit - used) if spec.options.time_limit > 0 else None
        threads = [thread for thread in (watch, lifelines, stall, limit) if thread]
        for thread in threads:
            thread.start()
        try:
            status = self.transport.run(argv, cwd=HOME, env=secrets)
        finally:
            for thread in threads:
                thread.stop()
        self.say(f"{spec.program} exited with status {status}")
        self.run_losses, self.ended_by = [], None
        if limit and limit.cause:
            self.ended_by = "its time limit"
            return JobEnd(TimeLimit.STATUS, limit.cause)
        if lifelines.cause:
            if spec.options.max_restarts:
                self.run_losses = self.losses(ready)
            return JobEnd(status or 1, lifelines.cause)
        if stall and stall.cause:
            self.ended_by = "the stall watch (stall action fail)"
            return JobEnd(status or 1, stall.cause)
        if status == 0:
            return JobEnd(0)
        losses = self.losses(ready)
        self.run_losses = losses if spec.options.max_restarts else []
        return JobEnd(status, self.cause_of(losses))

    def report_stacks(self, workers: list[Worker], heading: str) -> str:
        """`heading`, then every rank's stack into the job's log; returns their summary (where the odd ranks out
        are), or "" when no rank's stack could be taken."""
        if not self.spec.options.ptrace:
            self.say(f"{heading}; {stacks.NO_PTRACE}")
            return ""
        self.say(f"{heading}; every rank's stack:")
        found = self.gather_stacks(workers)
        for line in stacks.report(found).splitlines():
            self.say(line)
        return stacks.summary(found) if found else ""

    def gather_stacks(self, workers: list[Worker], native: bool = False) -> list[stacks.RankStack]:
        """Every rank's stack on every worker (py-spy in each worker container, over ssh); a worker that cannot
        say is named in the agent's log."""
        found: list[stacks.RankStack] = []
        for worker in workers:
            command = shlex.join([*STACKS, "collect", "--node", worker.name, *(["--native"] if native else [])])
            code, output = self.transport.ssh(worker.address, command, stacks.PY_SPY_TIMEOUT_SECONDS * 4)
            try:
                found += stacks.from_json(output.strip().splitlines()[-1]) if code == 0 else []
            except (ValueError, KeyError, IndexError):
                code = code or 1
            if code != 0:
                self.say(f"{worker.name}: no stacks ({(output.strip().splitlines() or ['no answer'])[-1]})")
        return found

    def loss(self, worker: Worker) -> LostWorker | None:
        """How the worker was lost during the run, or None while its lifeline holds and it answers."""
        if worker.address in self.lost:
            return self.lost[worker.address]
        line = self.lifelines.get(worker.address)
        if line is not None and not line.alive():
            return LostWorker(worker.name, line.silent())
        if line is None or not self.answers(worker, DISCOVERY_SSH_TIMEOUT):
            return LostWorker(worker.name, line is not None and self.went_silent(line))
        return None

    def went_silent(self, line: Lifeline) -> bool:
        """Whether a lifeline whose worker does not answer closes for silence (mpirun may notice a silent node just
        before the lifeline does): waits for it to close, SILENCE_SECONDS and one keepalive round at most."""
        deadline = self.clock() + SILENCE_SECONDS + KEEPALIVE_INTERVAL_SECONDS
        while line.alive() and self.clock() < deadline:
            self.sleep(0.5)
        return line.silent()

    def losses(self, ready: list[Worker]) -> list[LostWorker]:
        """The workers a run that failed lost."""
        return [loss for worker in ready if (loss := self.loss(worker))]

    def failure_cause(self, ready: list[Worker]) -> str | None:
        """Why a job that ran failed, when it is a lost worker (a rank's own error is in the job's output)."""
        return self.cause_of(self.losses(ready))

    def cause_of(self, losses: list[LostWorker]) -> str | None:
        """The failed job's cause, when it lost workers."""
        spec = self.spec
        if not losses:
            return None
        hint = spec.words.lost_hint
        if spec.elastic:
            minimum = spec.options.spelling.of("elastic_min_workers", spec.options.min_workers)
            return (
                f"the elastic job fell below {minimum} for {spec.options.elastic_timeout} s: lost "
                f"{', '.join(loss.short() for loss in losses)}; {hint}"
            )
        silent = [str(loss) for loss in losses if loss.silent]
        closed = [loss.name for loss in losses if not loss.silent]
        return "; ".join([*silent, *([f"{', '.join(closed)}: worker lost during the run; {hint}"] if closed else [])])

    def run(self) -> JobEnd:
        """The whole job; however it ends, its status is recorded and every worker is told."""
        ready: list[Worker] = []
        try:
            self.prepare()
            secrets = self.secrets()  # first: the file goes, whatever happens next
            ready = self.wait_until_ready()
            self.claim(ready)
            self.check_command(ready)
            self.stand_by()
            end = self.run_job(ready, secrets)
            while (again := self.restart_on(end, ready)) is not None:
                ready = again
                end = self.run_job(ready, secrets)
            if self.not_restarted and end.cause:
                end = JobEnd(end.status, f"{end.cause}; {self.not_restarted}")
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

    # --- restarts (--max-restarts; the decisions: launcher/core/restart.py) -----------------------------------------
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
        if self.spec.output_dir:
            records = "".join(item.record() for item in self.restarts)
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
        if spec.run_dir is None and trainer_option(spec.command, "--checkpoint-dir") is None:
            return None, spec.checkpoint_dir
        metrics = trainer_option(spec.command, "--metrics-file") or (
            f"{spec.run_dir}/metrics.jsonl" if spec.run_dir else None
        )
        epoch = restart.metrics_epoch(self.transport.read(metrics)) if metrics else None
        return epoch, spec.checkpoint_dir if epoch is not None else None

    def refuse(self, cause: str) -> JobEnd:
        """A job refused before it started (a bad setting): the workers that are up are told all the same."""
        self.say(f"error: {cause}")
        end = JobEnd(2, cause)
        self.prepare()
        self.finish(end, self.candidates(), patience=REFUSED_JOB_PATIENCE_SECONDS)
        return end

    # --- the end -----------------------------------------------------------------------------------------------
    def workers_to_tell(self, ready: list[Worker]) -> list[Worker]:
        everyone = [*ready, *self.candidates(), *self.claimed.values(), *self.spec.spares]
        known = {worker.address: worker for worker in everyone}
        return list(known.values())

    def finish(self, end: JobEnd, workers: list[Worker], patience: float = 0) -> None:
        spec = self.spec
        outcome = "succeeded" if end.succeeded else "FAILED"
        stays = "the workers keep running (--keep-running)" if spec.keep_running else "the workers stop now"
        self.say(f"job {outcome} (exit status {end.status}); {stays}")
        self.horovod_records()
        if spec.run_dir:
            where = f" in {spec.results_hint}" if spec.results_hint else ""
            self.say(f"results: {spec.run_dir} (metrics.jsonl, curves.png, tb/, checkpoints/){where}")
        elif spec.output_dir:
            where = f" in {spec.results_hint}" if spec.results_hint else ""
            self.say(f"results: {spec.output_dir} (Horovod's records){where}")
        elif spec.results_hint:
            self.say(f"results: {spec.results_hint}")
        self.keep_output()
        self.transport.write(JOB_STATUS, end.message() + "\n")
        self.wind_down(end, workers, patience)

    def keep_output(self) -> None:
        """The job's whole output (JOB_LOG, where the launcher's door keeps it) into its run folder: the containers
        and their logs go when the job ends, the shared folder stays."""
        folder = self.spec.run_folder
        output = self.transport.read(JOB_LOG) if folder else None
        if output is not None:
            self.transport.write(f"{folder}/{KEPT_JOB_LOG}", output)

    def horovod_records(self) -> None:
        """Where the run's timeline and autotune log are (--timeline, --autotune), each with what it shows in one
        line; the autotuner's choice is also written beside its log (autotune.json). A record the user's own --env
        sent elsewhere is theirs."""
        spec, folder = self.spec, self.spec.output_dir
        user_set = names_in(spec.options.env)
        if not folder:
            return
        if spec.options.timeline and "HOROVOD_TIMELINE" not in user_set:
            path = f"{folder}/{timeline.FILE}"
            text = self.transport.read(path)
            if not text:
                self.say(f"timeline: rank 0 wrote no {path} (the job ended before Horovod started)")
            else:
                try:
                    small = len(text) <= TIMELINE_SUMMARY_BYTES
                    shows = timeline.summarize(timeline.parse(text)).line() if small else ""
                except (ValueError, KeyError, TypeError):
                    shows = ""
                self.say(
                    f"timeline: {path}{f': {shows}' if shows else ''}; open it in https://ui.perfetto.dev or "
                    "chrome://tracing"
                )
        if spec.options.autotune and "HOROVOD_AUTOTUNE_LOG" not in user_set:
            log = self.transport.read(f"{folder}/{autotune.LOG}")
            record = autotune.read_log(log or "")
            self.transport.write(f"{folder}/{autotune.RECORD}", json.dumps(record, indent=1) + "\n")
            self.say(f"{autotune.line(record)}; {folder}/{autotune.RECORD}")

    def wind_down(self, end: JobEnd, workers: list[Worker], patience: float = 0) -> None:
        """Tells every worker the job ended, then removes the job's private files (the cluster's key, the secrets, the
        job spec; not with --keep-running, whose containers stay up for debugging). The worker whose container runs
        this agent (the launcher's rank 0) hears last, over its open lifeline: it stops soon after, and this agent
        with it."""
        message = KEEP_RUNNING if self.spec.keep_running else end.message()
        own = self.spec.agent_host
        self.tell_all([worker for worker in workers if worker.address != own], message, patience)
        if not self.spec.keep_running:  # a stopped container stays until `launcher stop`: nothing secret in it
            for path in JOB_PRIVATE_FILES:
                self.transport.remove(path)
        if own is not None:
            self.tell_all([worker for worker in workers if worker.address == own] or [Worker(own, own)], message)

    def tell_all(self, workers: list[Worker], message: str, patience: float = 0) -> None:
        """Every open lifeline gets the word before any is waited on. A worker whose lifeline closed has recorded
        that itself and stopped: one more word costs a short try. One never claimed is told over a new connection,
        retried for `patience` seconds."""
        lines = {
            worker.address: self.lifelines[worker.address] for worker in workers if worker.address in self.lifelines
        }
        sent = {address: line for address, line in lines.items() if line.alive()}
        for line in sent.values():
            line.send(message)
        for worker in workers:
            if worker.address in lines and worker.address not in sent:
                self.tell(worker, message, timeout=DISCOVERY_SSH_TIMEOUT)
        deadline = self.clock() + patience
        pending = [worker for worker in workers if worker.address not in lines]
        while pending:
            pending = [worker for worker in pending if not self.tell(worker, message)]
            if not pending or self.clock() > deadline:
                break
            self.sleep(1)
        for line in sent.values():
            line.wait()
        if pending:
            self.say(
                f"could not reach {', '.join(worker.name for worker in pending)} to say the job ended; "
                + self.spec.words.unreached_hint
            )

    def tell(self, worker: Worker, message: str, timeout: float = SSH_CONNECT_TIMEOUT_SECONDS) -> bool:
        command = lifeline_command(self.spec.driver)
        return self.pin(worker) and self.transport.ssh(worker.address, command, timeout, stdin=message + "\n")[0] == 0


class JobWatch(threading.Thread):
    """A thread beside the running job (run_job starts and stops them all): `done` ends it; `cause` is why it ended
    the job, when it did."""

    def __init__(self, agent: Agent, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.agent = agent
        self.done = threading.Event()
        self.cause: str | None = None

    def stop(self) -> None:
        self.done.set()
        self.join()  # before the wind-down reads the lifelines and the causes


class ElasticClaims(JobWatch):
    """During an elastic job: a lifeline to every worker that joins or comes back (discovery lets it in)."""

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent, "elastic-claims")

    def run(self) -> None:
        while not self.done.wait(ELASTIC_CLAIM_INTERVAL):
            try:
                agent = self.agent
                unclaimed = [
                    worker
                    for worker in agent.candidates()
                    if not (line := agent.lifelines.get(worker.address)) or not line.alive()
                ]
                # A lost worker comes back only as a new one (its container started again); the old one stops.
                joining = [
                    worker
                    for worker in unclaimed
                    if agent.answers(worker, DISCOVERY_SSH_TIMEOUT)
                    and (worker.address not in agent.lost or agent.unclaimed_since_start(worker))
                ]
                agent.claim(joining)
                for worker in joining:
                    if worker.address in agent.lost:
                        agent.mark_lost(worker.address, None)
                        agent.say(f"{worker.name}: a new worker there is claimed; host discovery lists it again")
            except Exception as error:  # noqa: BLE001  the job goes on; a later round tries again
                self.agent.say(f"could not claim a returning worker: {error}")


class LifelineWatch(JobWatch):
    """While the job runs: every claimed worker's lifeline. A worker whose line closes is lost: its container stopped
    or was killed, or it went silent (no answer for SILENCE_SECONDS: link down, host down or powered off). A
    fixed-size job cannot go on without it, and its ranks would wait in a collective that never completes: the job is
    ended at once, the loss its cause. An elastic job goes on without it: host discovery stops listing it (JOB_LOST);
    should the job then show no progress for its elastic timeout and ELASTIC_RECOVERY_GRACE_SECONDS (Horovod neither
    went on nor failed), it is ended, the loss its cause."""

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent, "lifeline-watch")
        self.last_loss: float | None = None

    def run(self) -> None:
        while self.cause is None and not self.done.wait(LIFELINE_POLL_SECONDS):
            try:
                self.check()
            except Exception as error:  # noqa: BLE001  the job goes on; the next round looks again
                self.agent.say(f"lifeline watch: {type(error).__name__}: {error}")

    def check(self) -> None:
        agent = self.agent
        for address, line in list(agent.lifelines.items()):
            if line.alive() or address in agent.lost:
                continue
            loss = LostWorker(agent.claimed[address].name, line.silent())
            agent.mark_lost(address, loss)
            if not agent.spec.elastic and address not in agent.running:  # a spare: the job goes on
                agent.say(f"{loss}; a spare, not used by any restart")
                continue
            self.last_loss = agent.clock()
            if not agent.spec.elastic:
                self.end(str(loss))
                return
            agent.say(f"{loss}; host discovery drops it and the elastic job goes on without it")
        if agent.spec.elastic and agent.lost and self.last_loss is not None:
            patience = agent.spec.options.elastic_timeout + ELASTIC_RECOVERY_GRACE_SECONDS
            if agent.clock() - self.last_loss > patience and agent.transport.output_age() > patience:
                lost = ", ".join(loss.short() for loss in agent.lost.values())
                self.end(f"the elastic job showed no progress for {patience} s after it lost {lost}")

    def end(self, cause: str) -> None:
        if self.agent.transport.stop_job():  # else it ended by itself meanwhile: its end stands
            self.cause = cause
            self.agent.say(f"error: {cause}; ending the job")


class StallWatch(JobWatch):
    """While the job runs: when it prints nothing and records no new metrics for the stall timeout, every rank's
    stack goes into the job's log once, and JOB_STALL says so for `launcher status` (also Horovod's own stall
    warnings); with the stall action `fail`, the job is ended with the stall as its cause."""

    def __init__(self, agent: Agent, workers: list[Worker]) -> None:
        super().__init__(agent, "stall-watch")
        self.workers = workers

    def run(self) -> None:
        spec, transport = self.agent.spec, self.agent.transport
        metrics = f"{spec.run_dir}/metrics.jsonl" if spec.run_dir else None
        where, written = "", None
        while not self.done.wait(min(STALL_POLL_SECONDS, max(1.0, spec.options.stall_timeout / 4))):
            try:
                idle = stall.idle_seconds(transport.output_age(), transport.file_age(metrics) if metrics else None)
                if not stall.is_stalled(idle, spec.options.stall_timeout):
                    if where:
                        self.agent.say(f"the job shows progress again after a stall of {idle:.0f} s or more")
                    where = ""
                elif not where:
                    where = self.stalled(idle) or "no rank's stack could be taken"
                record = stall.StallRecord(int(idle) if where else 0, where, transport.horovod_warning())
                if record != written:
                    transport.write(JOB_STALL, record.to_json() + "\n")
                    written = record
            except Exception as error:  # noqa: BLE001  the job goes on; the next round tries again
                self.agent.say(f"stall watch: {type(error).__name__}: {error}")

    def stalled(self, idle: float) -> str:
        spec = self.agent.spec
        where = self.agent.report_stacks(
            self.workers,
            f"the job looks stalled: no output and no new metrics for {idle:.0f} s (stall timeout "
            f"{spec.options.stall_timeout} s)",
        )
        if spec.options.stall_action == "fail":
            cause = f"the job stalled: no output and no new metrics for {idle:.0f} s; {where or 'no stacks'}"
            if self.agent.transport.stop_job():  # else it ended by itself meanwhile: its end stands
                self.cause = cause
                self.agent.say(f"error: {cause}; ending the job (stall action fail)")
        return where


class TimeLimit(JobWatch):
    """The job's time limit: once the job has run that long, every rank's stack goes into the job's log and the job
    is ended (as timeout(1) ends a command: exit status 124), with the limit and where the ranks were as its cause."""

    STATUS = 124

    def __init__(self, agent: Agent, workers: list[Worker], seconds: float) -> None:
        super().__init__(agent, "time-limit")
        self.workers, self.seconds = workers, seconds
        """What is left of the limit (all of it in the first run)."""

    def run(self) -> None:
        limit = self.agent.spec.options.time_limit
        if self.done.wait(max(0.0, self.seconds)):
            return
        where = self.agent.report_stacks(self.workers, f"the job ran past its time limit of {limit} s")
        cause = f"the job ran past its time limit of {limit} s; {where or 'no stacks'}"
        if self.agent.transport.stop_job():  # else it ended by itself while the stacks were taken: its end stands
            self.cause = cause
            self.agent.say(f"error: {cause}; ending the job")
