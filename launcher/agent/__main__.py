"""The job agent's commands, run inside the stack's containers:

    python -m launcher.agent compose [ARGS...]      compose's launcher service: the job its environment describes
    python -m launcher.agent run [--log FILE]       the job in JOB_SPEC (the multi-host launcher wrote it)
    python -m launcher.agent follow [--from N]      print JOB_LOG as it grows; exit with the job's status once it ends
    python -m launcher.agent discover               elastic host discovery: ADDRESS:SLOTS per worker answering now
    python -m launcher.agent agent-link --driver D  on a worker, over ssh: hold the agent's connection, record how the
                                                    job ended
    python -m launcher.agent stacks [--native]      every rank's stack now, on every worker, grouped

An MPIJob's launcher pod runs its own agent, `python -m launcher.agent.mpijob_pod` (launcher/agent/mpijob_pod.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import IO

from launcher.agent import compose, stacks
from launcher.agent.hostkeys import keyscan
from launcher.agent.job import Agent
from launcher.agent.transport import SshTransport, Transport, read_text, stop_on_signals, write_atomically
from launcher.agent.workers import DISCOVERY_SSH_TIMEOUT, Workers, lost_addresses, say
from launcher.core.jobend import JobEnd, parse_job_end
from launcher.core.jobspec import JobSpec
from launcher.core.options import one_line
from launcher.core.protocol import (
    AGENT_LINK,
    COMPOSE_SECRETS_DIR,
    JOB_END_FILE,
    JOB_LOG,
    JOB_LOST,
    JOB_SPEC,
    JOB_STATUS,
    KEEP_RUNNING,
    WORKER_CLAIMED,
    agent_line,
    lost_driver_message,
)


def run_compose(environ: dict[str, str], args: list[str]) -> int:
    """Compose's job, or its refusal (the workers are told either way). Compose's workers publish no host keys (replicas
    of one service would share one writable folder for them): the agent learns each at first contact."""
    transport = SshTransport()
    stop_on_signals(transport)
    try:
        spec = compose.job_spec(environ, args, compose.secret_names(transport.list_folder(COMPOSE_SECRETS_DIR)))
        transport.write(JOB_SPEC, spec.to_json())
    except (ValueError, OSError) as error:  # SettingsError, or TRAIN_COMMAND that shlex cannot split
        return Agent(compose.fallback_spec(environ), transport, scan=keyscan).refuse(one_line(error)).status
    return Agent(spec, transport, scan=keyscan).run().status


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
        transport.write(JOB_STATUS, end.to_json() + "\n")
        return end.status
    return Agent(spec, transport).run().status


def print_stacks(native: bool) -> int:
    """Every rank's stack now, grouped, for `launcher stacks` (and compose's `exec launcher ... stacks`)."""
    try:
        spec = JobSpec.from_json(Path(JOB_SPEC).read_text())
    except (OSError, ValueError, TypeError) as error:
        print(f"error: no job here to take stacks of ({JOB_SPEC}: {error})", file=sys.stderr)
        return 1
    if not spec.options.ptrace:
        print(f"error: {stacks.NO_PTRACE}", file=sys.stderr)
        return 1
    workers = Workers(spec, SshTransport(), say=lambda line: print(line, file=sys.stderr))
    sys.stdout.write(stacks.report(workers.gather_stacks(workers.candidates(), native)))
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
                    agent_line("-", f"error: the job's agent wrote no {log_path} within {wait_start:.0f} s"), flush=True
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
    alone (rank 0's node, whose shared folder holds the run) and later answers name them all. A worker the agent
    lost (JOB_LOST) is left out until it claims a new one there."""
    spec = JobSpec.from_json(transport.read(JOB_SPEC) or "")
    workers = Workers(spec, transport, say=lambda _: None)
    first_answered = Path(marker_dir) / f".elastic-discovery-{spec.job_id}"
    lost = lost_addresses(transport.read(JOB_LOST))
    lines = []
    for worker in workers.candidates():
        if worker.address not in lost and workers.answers(worker, DISCOVERY_SSH_TIMEOUT):
            lines.append(f"{worker.address}:{spec.slots_of(worker)}")
            if not first_answered.exists():
                first_answered.touch()
                break
    return lines


def lifeline(driver: str, stdin: IO[str], end_file: str = JOB_END_FILE, claimed: str = WORKER_CLAIMED) -> int:
    """A worker's end of the agent's ssh connection: waits for the agent's last line; records how the job ended, or
    that its driver went away, where the worker's entrypoint sees it (JOB_END_FILE) and stops the worker."""
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
    parser = argparse.ArgumentParser(prog="python -m launcher.agent", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("compose", help="run the job compose's environment describes (ARGS: the trainer's flags)")
    run = commands.add_parser("run", help=f"run the job in {JOB_SPEC}")
    run.add_argument("--log", help="append the agent's and the job's output to this file")
    following = commands.add_parser("follow", help=f"print {JOB_LOG} until the job ends; exit with its status")
    following.add_argument("--from", dest="start", type=int, default=0, help="the byte to start at")
    commands.add_parser("discover", help="elastic host discovery")
    line = commands.add_parser(AGENT_LINK, help="a worker's end of the agent's ssh connection")
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
