"""The job agent's side effects, behind a Transport: files in its own container, ssh to the workers, the job's
process. SshTransport is the real one; the unit tests use a stand-in (tests/standins.py), so every decision of the
agent (launcher/agent/job.py) is tested without containers.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Protocol

from app.rank_error import RankError
from launcher.agent.rank_errors import RankErrors
from launcher.core import legacy_keras, stall
from launcher.core.protocol import (
    CLUSTER_KEY,
    CLUSTER_SSH_DIR,
    COMPOSE_SECRETS_DIR,
    SECRETS_FILE,
    SSH_CONNECT_TIMEOUT_SECONDS,
    STOP_SIGNALS,
    Signalled,
)

SILENT_MARK = "not responding"
"""What ssh says (at LogLevel INFO) when it gives up on a server that stopped answering ("Timeout, server X not
responding."): the ServerAlive* settings of the cluster's ssh config (launcher.core.jobspec.ssh_config)."""
JOB_STOP_GRACE_SECONDS = 5
"""How long the job's process has, once asked to end (SIGTERM), before it and its ssh sessions are killed: mpirun
can wait forever on a node that went silent."""
OUTPUT_DRAIN_SECONDS = 5
"""How long the job's output is still read after its process ended (a killed mpirun's leftovers may hold it)."""


class Lifeline(Protocol):
    def alive(self) -> bool: ...

    def silent(self) -> bool:
        """True once the line has closed because the worker stopped answering (no reset: link or host down)."""

    def send(self, message: str) -> None:
        """Send the last line (the job's end record, or KEEP_RUNNING) and close."""

    def wait(self) -> None:
        """Until the worker's end has it (bounded)."""


class Transport(Protocol):
    """The agent's side effects: files in its own container, ssh to the workers, the job's process."""

    def resolve(self, service: str) -> list[str]: ...

    def read(self, path: str) -> str | None: ...

    def write(self, path: str, text: str, mode: int = 0o644) -> None: ...

    def remove(self, path: str) -> None:
        """The file is gone (it may not have been there)."""

    def ssh(self, address: str, command: str, timeout: float, stdin: str = "") -> tuple[int, str]: ...

    def lifeline(self, address: str, command: str) -> Lifeline: ...

    def list_folder(self, path: str) -> list[str]:
        """The names of the files in a folder of the agent's (none if it is not there)."""

    def take_secrets(self, names: tuple[str, ...]) -> dict[str, str]:
        """The job's secret settings by name, from SECRETS_FILE (removed once read) or, where the platform hands them
        in, a Compose secret's file (COMPOSE_SECRETS_DIR) or the agent's own environment (an MPIJob's Kubernetes
        Secret); a name found nowhere is left out."""

    def run(self, argv: list[str], cwd: str, env: dict[str, str] | None = None) -> int:
        """Runs the job, with `env` added to its environment (never its argv), its output through to the agent's;
        returns its exit status."""

    def output_age(self) -> float:
        """Seconds since the running job last printed a line (or since it started)."""

    def file_age(self, path: str) -> float | None:
        """Seconds since the file changed; None if it is not there."""

    def horovod_warning(self) -> str | None:
        """Horovod's latest stall warning in the job's output (stall.HorovodWarnings)."""

    def keras2_rank(self) -> int | None:
        """The first rank of the last run whose output shows it died of Keras 2 code on Keras 3
        (launcher/core/legacy_keras.py); None: none did."""

    def rank_error(self) -> RankError | None:
        """The record of the rank whose error ended the last run (launcher/agent/rank_errors.py); None: no rank wrote
        one."""

    def stop_job(self) -> bool:
        """Asks the running job to end (SIGTERM: mpirun and horovodrun pass it to every rank); False if it had
        already ended."""

    def stop_asked(self) -> bool:
        """Whether the agent was told to stop (STOP_SIGNALS): a job told so is not restarted."""

    def make_cluster_key(self) -> None: ...

    def make_run_dir(self, folder: str) -> None: ...


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
        # LogLevel INFO: ssh's word for a silent worker is an INFO line, which tells silence from a closed line.
        self.process = subprocess.Popen(
            ["ssh", "-o", "LogLevel=INFO", address, command],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.went_silent: bool | None = None

    def alive(self) -> bool:
        return self.process.poll() is None

    def silent(self) -> bool:
        if self.alive() or self.process.stderr is None:
            return False
        if self.went_silent is None:
            self.went_silent = SILENT_MARK in self.process.stderr.read()
        return self.went_silent

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
        self.keras = legacy_keras.Watch()
        self.errors = RankErrors()
        self.stop_signal: int | None = None
        """The stop signal the agent was sent, if any (stop_on_signals)."""

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

    def remove(self, path: str) -> None:
        try:
            Path(path).unlink(missing_ok=True)
        except OSError:  # a read-only mount (an MPIJob's Secret): nothing of ours to remove
            pass

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

    def list_folder(self, path: str) -> list[str]:
        try:
            return [entry.name for entry in Path(path).iterdir() if entry.is_file()]
        except OSError:
            return []

    def take_secrets(self, names: tuple[str, ...]) -> dict[str, str]:
        found: dict[str, str] = {}
        text = read_text(SECRETS_FILE)
        if text is not None:
            self.remove(SECRETS_FILE)
            found = json.loads(text)
        # Compose's secrets: a file each, read-only where Compose puts them (it goes with the container).
        # A file's last line break is no part of the value (`echo KEY > file`).
        composed = {
            name: text.rstrip("\r\n")
            for name in names
            if (text := read_text(f"{COMPOSE_SECRETS_DIR}/{name}")) is not None
        }
        sources = {**os.environ, **composed, **found}
        return {name: sources[name] for name in names if name in sources}

    def run(self, argv: list[str], cwd: str, env: dict[str, str] | None = None) -> int:
        if self.stop_signal is not None:  # told to stop between a run and its restart: no new run
            return 128 + self.stop_signal
        self.last_output = time.monotonic()
        self.keras = legacy_keras.Watch(argv)  # each run's own output; its -x pairs say whether Keras 2 was asked for
        self.errors = RankErrors()
        # A process group of its own, so that stop_job can kill it with its ssh sessions; signals to the agent reach
        # it through stop_on_signals.
        self.child = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        relay = threading.Thread(target=self.relay, args=(self.child.stdout,), name="job-output", daemon=True)
        relay.start()
        try:
            code = self.child.wait()
            relay.join(OUTPUT_DRAIN_SECONDS)
        finally:
            self.child, self.job_over = None, True
        return 128 - code if code < 0 else code

    def relay(self, output: IO[bytes]) -> None:
        """The job's output through to the agent's (the ranks' error records taken out), noting when it last printed
        (for the stall watch)."""
        for line in output:
            text = line.decode(errors="replace")
            if self.errors.feed(text):
                continue
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
            self.keras.feed(text)
            if not self.warnings.feed(text) and stall.is_progress(text):  # a stall warning is no progress
                self.last_output = time.monotonic()

    def output_age(self) -> float:
        return time.monotonic() - self.last_output

    def file_age(self, path: str) -> float | None:
        try:
            return time.time() - os.stat(path).st_mtime
        except OSError:
            return None

    def horovod_warning(self) -> str | None:
        return self.warnings.current()

    def keras2_rank(self) -> int | None:
        return self.keras.rank

    def rank_error(self) -> RankError | None:
        return self.errors.cause()

    def stop_job(self) -> bool:
        child = self.child
        if child is None or child.poll() is not None:
            return False
        child.send_signal(signal.SIGTERM)
        killer = threading.Timer(JOB_STOP_GRACE_SECONDS, kill_group, args=(child,))
        killer.daemon = True
        killer.start()
        return True

    def stop_asked(self) -> bool:
        return self.stop_signal is not None

    def make_cluster_key(self) -> None:
        from launcher.core.sshtrust import make_key_pair  # ssh-keygen, only where the agent makes the key

        keys = make_key_pair("horovod-stack cluster")
        write_atomically(CLUSTER_KEY, keys.private.decode(), 0o600)  # this container's own file system alone
        write_atomically(f"{CLUSTER_SSH_DIR}/authorized_keys", keys.public + "\n")  # compose: the workers' volume

    def make_run_dir(self, folder: str) -> None:
        run = Path(folder)
        run.mkdir(parents=True, exist_ok=True)
        latest = run.parent / "latest"
        temporary = run.parent / f".latest.{os.getpid()}"
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(run.name)
        os.replace(temporary, latest)


def kill_group(child: subprocess.Popen) -> None:
    """The job's process and its process group (mpirun's ssh sessions), unless it has ended."""
    if child.poll() is None:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop_on_signals(transport: SshTransport) -> None:
    """SIGTERM (docker stop), SIGINT and SIGHUP: a running job is asked to end (mpirun passes it to every rank) and
    ends as usual, status recorded and workers told; before the job runs, the agent stops at once the same way."""

    def handler(signum: int, _frame: object) -> None:
        transport.stop_signal = signum
        if transport.child is not None and transport.child.poll() is None:
            transport.child.send_signal(signum)
        elif not transport.job_over:  # once the job is over, its end is recorded and told as it is
            raise Signalled(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
