"""The job agent's side effects, behind a Transport: files in its own container, ssh to the workers, the job's
process. SshTransport is the real one; the unit tests use a stand-in (tests/conftest.py), so every decision of the
agent (launcher/agent/job.py) is tested without containers.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Protocol

from launcher.core import stall
from launcher.core.protocol import (
    CLUSTER_KEY,
    CLUSTER_SSH_DIR,
    SSH_CONNECT_TIMEOUT_SECONDS,
    STOP_SIGNALS,
    Signalled,
)

LIFELINE_KEEPALIVE = ("-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3")
"""The agent's side of a lifeline notices a dead worker within 15 s (sshd_config's ClientAlive* is the other side)."""


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

    def stop_job(self) -> bool:
        """Asks the running job to end (SIGTERM: mpirun and horovodrun pass it to every rank); False if it had
        already ended."""

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

    def stop_job(self) -> bool:
        child = self.child
        if child is None or child.poll() is not None:
            return False
        child.send_signal(signal.SIGTERM)
        return True

    def make_cluster_key(self) -> None:
        from launcher.core.sshtrust import make_key_pair  # ssh-keygen, only where the agent makes the key

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
