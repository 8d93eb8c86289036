"""The job agent: owns one job from inside the rank-0 container, whichever door started it.

    python -m launcher.agent compose [ARGS...]    compose's launcher service: the job its environment describes
    python -m launcher.agent mpijob [OPTIONS] -- COMMAND   an MPIJob's launcher pod (launcher/mpijob_job.py)
    python -m launcher.agent run [--log FILE]     the job in JOB_SPEC (the multi-host launcher wrote it)
    python -m launcher.agent follow [--from N]    print JOB_LOG as it grows; exit with the job's status once it ends
    python -m launcher.agent discover             elastic host discovery: ADDRESS:SLOTS per worker answering now
    python -m launcher.agent lifeline --driver D  on a worker, over ssh: hold the line, record how the job ended
    python -m launcher.agent stacks [--native]    every rank's stack now, on every worker, grouped

One job, in order (Agent.run): ssh client set-up (for compose also the cluster's key pair) -> readiness: every
worker's published host key pinned and its sshd answering -> a lifeline to every worker -> a check that every
worker can start the command -> the hostfile and mpirun (or elastic horovodrun) -> its exit status and root cause
-> every worker told that the job ended. While it runs, a stall watch notices a job that prints nothing and records
no new metrics for the stall timeout, and gathers every rank's stack once (launcher/stall.py, stacks.py). The job's
life is the cluster's: it does not depend on the client that started it, and when the agent itself dies (its
container killed, out of memory, a reboot) its lifelines close and every worker stops by itself.

Side effects go through a Transport (SshTransport here; a stand-in in the unit tests), so every decision above is
tested without containers.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Protocol

from launcher import stacks, stall
from launcher.plan import JobSpec, Worker, command_probe, hostfile, pin_known_host, ssh_config
from launcher.protocol import (
    AGENT,
    AGENT_PREFIX,
    CLUSTER_KEY,
    CLUSTER_SSH_DIR,
    HOME,
    HOSTFILE_PATH,
    HOSTKEYS_DIR,
    JOB_END_FILE,
    JOB_LOG,
    JOB_SPEC,
    JOB_STALL,
    JOB_STATUS,
    KEEP_RUNNING,
    KNOWN_HOSTS,
    SSH_CONFIG,
    SSH_CONNECT_TIMEOUT_SECONDS,
    STACKS,
    STOP_SIGNALS,
    WORKER_CLAIM_TIMEOUT_SECONDS,
    WORKER_CLAIMED,
    JobEnd,
    Signalled,
    lost_driver_message,
    parse_job_end,
)

LIFELINE_KEEPALIVE = ("-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3")
"""The agent's side of a lifeline notices a dead worker within 15 s (sshd_config's ClientAlive* is the other side)."""
DISCOVERY_SSH_TIMEOUT = 2
REFUSED_JOB_PATIENCE_SECONDS = 30
"""How long a job refused before it started keeps trying to tell the workers (they may still be starting)."""
ELASTIC_CLAIM_INTERVAL = 2
STALL_POLL_SECONDS = 5

Say = Callable[[str], None]


def say(message: str) -> None:
    print(f"{AGENT_PREFIX}{time.strftime('%H:%M:%S')}] {message}", flush=True)


class JobError(RuntimeError):
    """The job could not run, or failed for a reason the agent can name; one line naming the fix."""


class Lifeline(Protocol):
    def alive(self) -> bool: ...

    def send(self, message: str) -> None:
        """Send the last line (a job-end message, or KEEP_RUNNING) and close."""

    def wait(self) -> None:
        """Until the worker's end has it (bounded)."""


class Transport(Protocol):
    """The agent's side effects: files in its own container, ssh to the workers, the job's process."""

    def resolve(self, service: str) -> list[str]: ...

    def read(self, path: str) -> str | None: ...

    def write(self, path: str, text: str, mode: int = 0o644) -> None: ...

    def ssh(self, address: str, command: str, timeout: float, stdin: str = "") -> tuple[int, str]: ...

    def lifeline(self, address: str, command: str) -> Lifeline: ...

    def run(self, argv: list[str], cwd: str) -> int:
        """Runs the job, its output through to the agent's; returns its exit status."""

    def output_age(self) -> float:
        """Seconds since the running job last printed a line (or since it started)."""

    def file_age(self, path: str) -> float | None:
        """Seconds since the file changed; None if it is not there."""

    def horovod_warning(self) -> str | None:
        """Horovod's latest stall warning in the job's output (stall.HorovodWarnings)."""

    def stop_job(self) -> None:
        """Asks the running job to end (SIGTERM: mpirun and horovodrun pass it to every rank)."""

    def make_cluster_key(self) -> None: ...

    def make_run_dir(self, folder: str) -> None: ...


def lifeline_command(driver: str) -> str:
    return shlex.join([*AGENT, "lifeline", "--driver", driver])


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
        updated = pin_known_host(known, worker.address, self.spec.ssh_port, key)
        if updated != known:
            self.transport.write(KNOWN_HOSTS, updated, 0o600)
        return True

    def answers(self, worker: Worker, timeout: float = SSH_CONNECT_TIMEOUT_SECONDS) -> bool:
        return self.pin(worker) and self.transport.ssh(worker.address, "true", timeout)[0] == 0

    def prepare(self) -> None:
        if self.spec.make_key:
            self.transport.make_cluster_key()
        self.transport.write(SSH_CONFIG, ssh_config(self.spec.ssh_port), 0o600)
        self.transport.write(KNOWN_HOSTS, "", 0o600)  # pins are per job: a worker's key is new in every container
        if self.spec.run_dir:
            self.transport.make_run_dir(self.spec.run_dir)

    def wait_until_ready(self) -> list[Worker]:
        """The job's workers once every one's sshd answers, in the candidates' order (rank 0's node first)."""
        spec = self.spec
        deadline = self.clock() + spec.ready_timeout
        ready: list[Worker] = []
        while True:
            candidates = self.candidates()
            for worker in candidates:
                if worker not in ready and self.answers(worker):
                    ready.append(worker)
                    self.say(
                        f"{worker.name}: sshd answers on port {spec.ssh_port} ({len(ready)}/"
                        f"{spec.expected_workers} workers answer over ssh)"
                    )
            if len(ready) >= spec.expected_workers:
                order = {worker: index for index, worker in enumerate(candidates)}
                return sorted(ready, key=lambda worker: order.get(worker, len(order)))[: spec.expected_workers]
            if self.clock() > deadline:
                waiting = [worker.name for worker in candidates if worker not in ready]
                raise JobError(
                    f"only {len(ready)} of {spec.expected_workers} workers answered ssh on port "
                    f"{spec.ssh_port} within {spec.ready_timeout:.0f} s (still waiting for "
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

    def run_job(self, ready: list[Worker]) -> JobEnd:
        spec = self.spec
        argv = spec.job_argv()
        self.transport.write(HOSTFILE_PATH, hostfile(ready, spec.slots))
        self.say(f"hostfile: {' '.join(f'{worker.address}:{spec.slots_of(worker)}' for worker in ready)}")
        self.say(f"running: {' '.join(argv)}")
        watch = ElasticClaims(self) if spec.elastic else None
        stall = StallWatch(self, ready) if spec.stall_timeout > 0 else None
        for thread in (watch, stall):
            if thread:
                thread.start()
        try:
            status = self.transport.run(argv, cwd=HOME)
        finally:
            for thread in (watch, stall):
                if thread:
                    thread.stop()
        self.say(f"{spec.program} exited with status {status}")
        if stall and stall.cause:
            return JobEnd(status or 1, stall.cause)
        return JobEnd(status, None if status == 0 else self.failure_cause(ready))

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

    def failure_cause(self, ready: list[Worker]) -> str | None:
        """Why a job that ran failed, when it is a lost worker (a rank's own error is in the job's output)."""
        spec = self.spec
        lost = [
            worker.name
            for worker in ready
            if not (line := self.lifelines.get(worker.address))
            or not line.alive()
            or not self.answers(worker, DISCOVERY_SSH_TIMEOUT)
        ]
        if not lost:
            return None
        if spec.elastic:
            return (
                f"the elastic job fell below {spec.words.elastic_minimum} for {spec.elastic_timeout} s: lost "
                f"{', '.join(lost)}; {spec.words.lost_hint}"
            )
        return f"{', '.join(lost)}: worker lost during the run; {spec.words.lost_hint}"

    def run(self) -> JobEnd:
        """The whole job; however it ends, its status is recorded and every worker is told."""
        ready: list[Worker] = []
        try:
            self.prepare()
            ready = self.wait_until_ready()
            self.claim(ready)
            self.check_command(ready)
            end = self.run_job(ready)
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

    def refuse(self, cause: str) -> JobEnd:
        """A job refused before it started (a bad setting): the workers that are up are told all the same."""
        self.say(f"error: {cause}")
        end = JobEnd(2, cause)
        self.prepare()
        self.finish(end, self.candidates(), patience=REFUSED_JOB_PATIENCE_SECONDS)
        return end

    # --- the end -----------------------------------------------------------------------------------------------
    def workers_to_tell(self, ready: list[Worker]) -> list[Worker]:
        known = {worker.address: worker for worker in [*ready, *self.candidates()]}
        return list(known.values())

    def finish(self, end: JobEnd, workers: list[Worker], patience: float = 0) -> None:
        spec = self.spec
        outcome = "succeeded" if end.succeeded else "FAILED"
        stays = "the workers keep running (--keep-running)" if spec.keep_running else "the workers stop now"
        self.say(f"job {outcome} (exit status {end.status}); {stays}")
        if spec.run_dir:
            where = f" in {spec.results_hint}" if spec.results_hint else ""
            self.say(f"results: {spec.run_dir} (metrics.jsonl, curves.png, tb/, checkpoints/){where}")
        elif spec.results_hint:
            self.say(f"results: {spec.results_hint}")
        self.transport.write(JOB_STATUS, end.message() + "\n")
        self.wind_down(end, workers, patience)

    def wind_down(self, end: JobEnd, workers: list[Worker], patience: float = 0) -> None:
        """Tells every worker the job ended. The worker whose container runs this agent (the launcher's rank 0)
        hears last: it stops soon after, and this agent with it."""
        message = KEEP_RUNNING if self.spec.keep_running else end.message()
        own = self.spec.agent_host
        self.tell_all([worker for worker in workers if worker.address != own], message, patience)
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
                f"could not reach {', '.join(worker.name for worker in pending)} to say the job ended; a "
                f"worker no job claims stops by itself {WORKER_CLAIM_TIMEOUT_SECONDS} s after it started"
            )

    def tell(self, worker: Worker, message: str, timeout: float = SSH_CONNECT_TIMEOUT_SECONDS) -> bool:
        command = lifeline_command(self.spec.driver)
        return self.pin(worker) and self.transport.ssh(worker.address, command, timeout, stdin=message + "\n")[0] == 0


class ElasticClaims(threading.Thread):
    """During an elastic job: a lifeline to every worker that joins or comes back (discovery lets it in)."""

    def __init__(self, agent: Agent) -> None:
        super().__init__(name="elastic-claims", daemon=True)
        self.agent = agent
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(ELASTIC_CLAIM_INTERVAL):
            try:
                unclaimed = [
                    worker
                    for worker in self.agent.candidates()
                    if not (line := self.agent.lifelines.get(worker.address)) or not line.alive()
                ]
                self.agent.claim([worker for worker in unclaimed if self.agent.answers(worker, DISCOVERY_SSH_TIMEOUT)])
            except Exception as error:  # noqa: BLE001  the job goes on; a later round tries again
                self.agent.say(f"could not claim a returning worker: {error}")

    def stop(self) -> None:
        self.done.set()
        self.join()  # before the wind-down reads the lifelines


class StallWatch(threading.Thread):
    """While the job runs: when it prints nothing and records no new metrics for the stall timeout, every rank's
    stack goes into the job's log once, and JOB_STALL says so for `launcher status` (also Horovod's own stall
    warnings); with the stall action `fail`, the job is ended with the stall as its cause."""

    def __init__(self, agent: Agent, workers: list[Worker]) -> None:
        super().__init__(name="stall-watch", daemon=True)
        self.agent, self.workers = agent, workers
        self.done = threading.Event()
        self.cause: str | None = None
        """Why the job was ended (the stall), when the stall action is `fail`."""

    def run(self) -> None:
        spec, transport = self.agent.spec, self.agent.transport
        metrics = f"{spec.run_dir}/metrics.jsonl" if spec.run_dir else None
        where, written = "", None
        while not self.done.wait(min(STALL_POLL_SECONDS, max(1.0, spec.stall_timeout / 4))):
            try:
                idle = stall.idle_seconds(transport.output_age(), transport.file_age(metrics) if metrics else None)
                if not stall.is_stalled(idle, spec.stall_timeout):
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
        self.agent.say(
            f"the job looks stalled: no output and no new metrics for {idle:.0f} s (stall timeout "
            f"{spec.stall_timeout} s); every rank's stack:"
        )
        found = self.agent.gather_stacks(self.workers)
        for line in stacks.report(found).splitlines():
            self.agent.say(line)
        where = stacks.summary(found) if found else ""
        if spec.stall_action == "fail":
            self.cause = f"the job stalled: no output and no new metrics for {idle:.0f} s; {where or 'no stacks'}"
            self.agent.say(f"error: {self.cause}; ending the job (stall action fail)")
            self.agent.transport.stop_job()
        return where

    def stop(self) -> None:
        self.done.set()
        self.join()


# --- the real side effects ---------------------------------------------------------------------------------------
def read_text(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def write_atomically(path: str, text: str, mode: int = 0o644) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.chmod(temporary, mode)
    os.replace(temporary, target)


class SshLifeline:
    def __init__(self, address: str, command: str) -> None:
        # A session of its own: a signal to the agent's process group must not cut the line before the last word.
        self.process = subprocess.Popen(
            ["ssh", *LIFELINE_KEEPALIVE, address, command],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def send(self, message: str) -> None:
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(message + "\n")
            self.process.stdin.close()
        except OSError:  # the line closed already: the worker has recorded that itself
            pass

    def wait(self) -> None:
        try:
            self.process.wait(timeout=SSH_CONNECT_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class SshTransport:
    def __init__(self) -> None:
        self.child: subprocess.Popen | None = None
        self.job_over = False
        self.last_output = time.monotonic()
        self.warnings = stall.HorovodWarnings()

    def resolve(self, service: str) -> list[str]:
        try:
            found = socket.getaddrinfo(service, None, socket.AF_INET, socket.SOCK_STREAM)
        except socket.gaierror:
            return []
        return sorted({str(entry[4][0]) for entry in found}, key=ipaddress.ip_address)

    def read(self, path: str) -> str | None:
        return read_text(path)

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomically(path, text, mode)

    def ssh(self, address: str, command: str, timeout: float, stdin: str = "") -> tuple[int, str]:
        try:
            done = subprocess.run(
                ["ssh", "-o", f"ConnectTimeout={max(1, int(timeout))}", address, command],
                input=stdin,
                capture_output=True,
                text=True,
                timeout=timeout + 5,
            )
        except subprocess.TimeoutExpired:
            return 124, f"no answer within {timeout:.0f} s"
        return done.returncode, done.stdout + done.stderr

    def lifeline(self, address: str, command: str) -> Lifeline:
        return SshLifeline(address, command)

    def run(self, argv: list[str], cwd: str) -> int:
        # The job's output passes through here, so the stall watch knows when it last printed.
        self.last_output = time.monotonic()
        self.child = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert self.child.stdout is not None
        try:
            for line in self.child.stdout:
                sys.stdout.buffer.write(line)
                sys.stdout.buffer.flush()
                if not self.warnings.feed(line.decode(errors="replace")):  # a stall warning is no progress
                    self.last_output = time.monotonic()
            code = self.child.wait()
        finally:
            self.child, self.job_over = None, True
        return 128 - code if code < 0 else code

    def output_age(self) -> float:
        return time.monotonic() - self.last_output

    def file_age(self, path: str) -> float | None:
        try:
            return time.time() - os.stat(path).st_mtime
        except OSError:
            return None

    def horovod_warning(self) -> str | None:
        return self.warnings.current()

    def stop_job(self) -> None:
        child = self.child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    def make_cluster_key(self) -> None:
        from launcher.sshtrust import make_key_pair  # ssh-keygen, only where the agent makes the key

        keys = make_key_pair("horovod-stack cluster")
        write_atomically(CLUSTER_KEY, keys.private.decode(), 0o600)
        write_atomically(f"{CLUSTER_KEY}.pub", keys.public + "\n")
        write_atomically(f"{CLUSTER_SSH_DIR}/authorized_keys", keys.public + "\n")

    def make_run_dir(self, folder: str) -> None:
        run = Path(folder)
        run.mkdir(parents=True, exist_ok=True)
        latest = run.parent / "latest"
        temporary = run.parent / f".latest.{os.getpid()}"
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(run.name)
        os.replace(temporary, latest)


def stop_on_signals(transport: SshTransport) -> None:
    """SIGTERM (docker stop), SIGINT and SIGHUP: a running job is asked to end (mpirun passes it to every rank) and
    ends as usual, status recorded and workers told; before the job runs, the agent stops at once the same way."""

    def handler(signum: int, _frame: object) -> None:
        if transport.child is not None and transport.child.poll() is None:
            transport.child.send_signal(signum)
        elif not transport.job_over:  # once the job is over, its end is recorded and told as it is
            raise Signalled(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)


# --- the commands ----------------------------------------------------------------------------------------------
def run_compose(environ: dict[str, str], args: list[str]) -> int:
    from launcher import compose_job

    transport = SshTransport()
    stop_on_signals(transport)
    try:
        spec = compose_job.job_spec(environ, args)
        transport.write(JOB_SPEC, spec.to_json())
    except (ValueError, OSError) as error:  # SpecError, or TRAIN_COMMAND that shlex cannot split
        return Agent(compose_job.fallback_spec(environ), transport).refuse(str(error)).status
    return Agent(spec, transport).run().status


def run_spec(log_file: str | None) -> int:
    if log_file:
        log = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
    transport = SshTransport()
    stop_on_signals(transport)
    try:
        spec = JobSpec.from_json(Path(JOB_SPEC).read_text())
    except (OSError, ValueError, TypeError) as error:
        end = JobEnd(
            2, f"the job agent cannot read {JOB_SPEC} ({error}); start the job with a launcher of the image's version"
        )
        say(f"error: {end.cause}")
        transport.write(JOB_STATUS, end.message() + "\n")
        return end.status
    return Agent(spec, transport).run().status


def print_stacks(native: bool) -> int:
    """Every rank's stack now, grouped, for `launcher stacks` (and compose's `exec launcher ... stacks`)."""
    try:
        spec = JobSpec.from_json(Path(JOB_SPEC).read_text())
    except (OSError, ValueError, TypeError) as error:
        print(f"error: no job here to take stacks of ({JOB_SPEC}: {error})", file=sys.stderr)
        return 1
    agent = Agent(spec, SshTransport(), say=lambda line: print(line, file=sys.stderr))
    sys.stdout.write(stacks.report(agent.gather_stacks(agent.candidates(), native)))
    return 0


def follow(
    out: IO[bytes],
    start: int = 0,
    wait_start: float = 60,
    poll: float = 0.2,
    log_path: str = JOB_LOG,
    status_path: str = JOB_STATUS,
) -> int:
    """Prints JOB_LOG from byte `start` as it grows; returns the job's status once JOB_STATUS says it ended."""
    started, position = time.monotonic(), start
    while True:
        ended = parse_job_end(read_text(status_path))  # read before the log: then the log is complete
        try:
            with open(log_path, "rb") as log:
                log.seek(position)
                chunk = log.read()
        except FileNotFoundError:
            chunk = b""
            if time.monotonic() - started > wait_start:
                print(
                    f"{AGENT_PREFIX}-] error: the job's agent wrote no {log_path} within {wait_start:.0f} s", flush=True
                )
                return 1
        if chunk:
            out.write(chunk)
            out.flush()
            position += len(chunk)
        elif ended:
            return ended.status
        else:
            time.sleep(poll)


def discover(transport: Transport, marker_dir: str = "/tmp") -> list[str]:
    """Elastic Horovod's host discovery (horovodrun runs it about once a second): ADDRESS:SLOTS for each worker whose
    sshd answers right now, in the candidates' order. Horovod gives the lowest ranks to the hosts it has known
    longest but takes its first discovery as a set, in no order: so a job's first answer names the first candidate
    alone (rank 0's node, whose shared folder holds the run) and later answers name them all."""
    spec = JobSpec.from_json(transport.read(JOB_SPEC) or "")
    agent = Agent(spec, transport, say=lambda _: None)
    first_answered = Path(marker_dir) / f".elastic-discovery-{spec.job_id}"
    lines = []
    for worker in agent.candidates():
        if agent.answers(worker, DISCOVERY_SSH_TIMEOUT):
            lines.append(f"{worker.address}:{spec.slots_of(worker)}")
            if not first_answered.exists():
                first_answered.touch()
                break
    return lines


def lifeline(driver: str, stdin: IO[str], end_file: str = JOB_END_FILE, claimed: str = WORKER_CLAIMED) -> int:
    """A worker's end of a lifeline: waits for the agent's last line; records how the job ended, or that its
    driver went away, where the worker's entrypoint sees it (JOB_END_FILE) and stops the worker."""
    Path(claimed).touch()
    message = stdin.readline().strip()
    if message == KEEP_RUNNING:
        return 0
    if parse_job_end(message) is None:
        message = lost_driver_message(driver)
    write_atomically(end_file, message + "\n")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["compose"]:  # the trainer's flags follow, which argparse would take for the agent's own
        args = argv[2:] if argv[1:2] == ["--"] else argv[1:]
        return run_compose(dict(os.environ), args)
    if argv[:1] == ["mpijob"]:  # the same: the job's command follows `--`
        from launcher import mpijob_job

        return mpijob_job.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m launcher.agent", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("compose", help="run the job compose's environment describes (ARGS: the trainer's flags)")
    commands.add_parser("mpijob", help="run an MPIJob's job in its launcher pod (launcher export mpijob)")
    run = commands.add_parser("run", help=f"run the job in {JOB_SPEC}")
    run.add_argument("--log", help="append the agent's and the job's output to this file")
    following = commands.add_parser("follow", help=f"print {JOB_LOG} until the job ends; exit with its status")
    following.add_argument("--from", dest="start", type=int, default=0, help="the byte to start at")
    commands.add_parser("discover", help="elastic host discovery")
    line = commands.add_parser("lifeline", help="a worker's end of the agent's lifeline")
    line.add_argument("--driver", default="the job's agent")
    stacking = commands.add_parser("stacks", help="every rank's stack now, grouped")
    stacking.add_argument("--native", action="store_true", help="native (C/C++) frames too")
    options = parser.parse_args(argv)
    if options.command == "stacks":
        return print_stacks(options.native)
    if options.command == "run":
        return run_spec(options.log)
    if options.command == "follow":
        return follow(sys.stdout.buffer, options.start)
    if options.command == "discover":
        sys.stdout.write("".join(f"{line}\n" for line in discover(SshTransport())))
        return 0
    return lifeline(options.driver, sys.stdin)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
