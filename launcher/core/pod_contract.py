"""The pod contract between the MPIJob document and its launcher pod: the arguments `launcher export mpijob`
(launcher/k8s/mpijob.py) writes into the launcher pod's command, and the launcher pod's agent
(launcher/agent/mpijob_pod.py, run by the image's `mpijob-launcher` role) reads back, so neither side imports the
other. The paths the operator mounts are the stack's shared facts (launcher/core/protocol.py MPIJOB_*).
"""

from __future__ import annotations

import argparse
import dataclasses
import math

from launcher.core.options import JobOptions, SettingsError, job_command
from launcher.core.protocol import MPIJOB_HOSTFILE, MPIJOB_SSH_AUTH_DIR

PROGRAM = "python -m launcher.agent.mpijob_pod"
"""What the image's `mpijob-launcher` role runs with these arguments (docker/entrypoint.sh)."""


@dataclasses.dataclass(frozen=True)
class PodArgs:
    """The launcher pod's arguments (as agent_args writes them): where the operator put its files, and the job."""

    options: JobOptions
    name: str = "mpijob"
    """The MPIJob's name (--job), which its run folders start with."""
    ssh_auth: str = MPIJOB_SSH_AUTH_DIR
    hostfile: str = MPIJOB_HOSTFILE


def agent_args(pod: PodArgs) -> list[str]:
    """The launcher pod's arguments to PROGRAM for `pod` (parse reads them back); the
    defaults are left out, the job's name never."""
    options = pod.options
    argv = ["--job", pod.name]
    for flag, value, usual in (
        ("--ssh-auth", pod.ssh_auth, MPIJOB_SSH_AUTH_DIR),
        ("--hostfile", pod.hostfile, MPIJOB_HOSTFILE),
        ("--network-interface", options.network_interface, None),
        ("--schedule-timeout", f"{options.ready_timeout:g}" if options.ready_timeout != math.inf else None, None),
        ("--min-workers", str(options.min_workers) if options.elastic else None, None),
    ):
        if value is not None and value != usual:
            argv += [flag, value]
    if options.ptrace:  # the workers have SYS_PTRACE: the agent may take the ranks' stacks
        argv.append("--ptrace")
    for item in options.env:
        argv += ["--env", item]
    for name in options.secrets:  # the name alone: its value is in the pod's environment (a Kubernetes Secret)
        argv += ["--secret", name]
    return [*argv, "--", *options.command]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise SettingsError(f"{message}; the launcher pod's arguments are written by `launcher export mpijob`")


def parse(argv: list[str]) -> PodArgs:
    """The launcher pod's arguments: the agent's options, then `--` and the command (job_command of those words)."""
    split = argv.index("--") if "--" in argv else len(argv)
    parser = _Parser(prog=PROGRAM, add_help=False)
    parser.add_argument("--job", dest="name", default=PodArgs.name)
    parser.add_argument("--ssh-auth", default=PodArgs.ssh_auth)
    parser.add_argument("--hostfile", default=PodArgs.hostfile)
    parser.add_argument("--network-interface")
    parser.add_argument("--schedule-timeout", type=float, default=math.inf)
    parser.add_argument("--min-workers", type=int)
    parser.add_argument("--ptrace", action="store_true")
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("--secret", action="append", default=[])
    known = parser.parse_args(argv[:split])
    options = JobOptions(
        command=job_command(argv[split + 1 :]),
        env=tuple(known.env),
        secrets=tuple(known.secret),
        network_interface=known.network_interface or None,
        ready_timeout=known.schedule_timeout,
        ptrace=known.ptrace,
        elastic=known.min_workers is not None,
        elastic_min_workers=known.min_workers,
        launch_method="mpijob",
    )
    return PodArgs(options=options, name=known.name, ssh_auth=known.ssh_auth, hostfile=known.hostfile)
