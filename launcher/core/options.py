"""One job's options, whichever door runs it: the command, its environment, the NIC, the SSH port, the timeouts, the
stall and elastic settings, the user's code and folders. Validated once, at construction; every rule about a job's
options is here and nowhere else, and each error names the setting as the door's users write it (a flag, an .env
key, an MPIJob export option) and the fix.

A door builds one JobOptions from what its users set (the launcher from .env and flags, compose from its
environment, the MPIJob door from its arguments); the job spec the agent runs carries it (launcher.core.job).
Adding an option is one field here, its rule in `problems`, and the flag that sets it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import PurePosixPath

from app.entrypoint import TRAINER
from launcher.core.protocol import (
    ELASTIC_TIMEOUT_SECONDS,
    HOME,
    READY_TIMEOUT_SECONDS,
    SHARED_MOUNT,
    SSH_PORT,
    STALL_TIMEOUT_SECONDS,
    WORKDIR,
)
from launcher.core.stall import STALL_ACTIONS

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_PATHS = (SHARED_MOUNT, WORKDIR, HOME, "/cluster", "/opt/horovod-stack")
"""Where the stack's own files live in a worker: a mount may not cover them."""


class SettingsError(ValueError):
    """Settings a door refuses: one line per problem, each naming the setting and the fix."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class Spelling:
    """How one door's users write each option: a flag (`--ssh-port 70000`, fixed by passing it again) or a
    settings file's key (`SSH_PORT=70000`, fixed in .env)."""

    names: Mapping[str, str]
    """JobOptions field -> how it is set (`--ssh-port`, `SSH_PORT`); "workers": what counts the workers."""
    flag_fix: str = "pass {name} with one that is"

    def of(self, option: str, value: object = None) -> str:
        name = self.names.get(option, option)
        if value is None:
            return name
        return f"{name}={value}" if name.isupper() else f"{name} {value}"

    def fix_for(self, option: str) -> str:
        name = self.of(option)
        return "fix it in .env" if name.isupper() else self.flag_fix.format(name=name)


LAUNCHER_SPELLING = Spelling(
    {
        "env": "--env",
        "network_interface": "--network-interface",
        "ssh_port": "--ssh-port",
        "ready_timeout": "READY_TIMEOUT",
        "stall_timeout": "--stall-timeout",
        "stall_action": "--stall-action",
        "time_limit": "--time-limit",
        "elastic": "--elastic",
        "elastic_min_workers": "--min-nodes",
        "elastic_max_workers": "--max-nodes",
        "elastic_timeout": "ELASTIC_TIMEOUT",
        "restart_workers": "--restart-workers",
        "mounts": "--mount",
        "workers": "node(s) in --nodes",
    }
)
"""The multi-host launcher's flags (and the .env keys that have no flag)."""


@dataclass(frozen=True)
class Bind:
    """A host folder in every worker (--mount HOST_PATH:CONTAINER_PATH[:ro]), e.g. a dataset on each node's disk."""

    source: str
    target: str
    read_only: bool = False

    def __str__(self) -> str:
        return f"{self.source} -> {self.target}{' (read-only)' if self.read_only else ''}"


def parse_bind(text: str) -> Bind:
    """HOST_PATH:CONTAINER_PATH[:ro|rw], both absolute; raises ValueError naming the fix."""
    parts = text.split(":")
    mode = parts.pop() if len(parts) == 3 and parts[2] in ("ro", "rw") else "rw"
    if len(parts) != 2 or not all(part.startswith("/") for part in parts):
        raise ValueError(f"--mount {text!r} is not HOST_PATH:CONTAINER_PATH[:ro], both absolute: e.g. /data:/data:ro")
    target = str(PurePosixPath(parts[1]))
    covered = [path for path in RESERVED_PATHS if path == target or path.startswith(target.rstrip("/") + "/")]
    if covered:
        raise ValueError(f"--mount {text!r} would hide the stack's own {covered[0]}: mount it elsewhere, e.g. /data")
    return Bind(str(PurePosixPath(parts[0])), target, mode == "ro")


def env_problem(item: str) -> str | None:
    """Why `item` is not KEY=VALUE for a rank's environment; None if it is."""
    key, separator, _ = item.partition("=")
    if not separator or not ENV_NAME.match(key):
        return f"--env {item!r} is not KEY=VALUE with a variable name as KEY"
    return None


def job_command(args: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """What every rank runs, from the words after `--`: a command of the user's when the first word is not an
    option (as with mpirun and horovodrun), else the bundled trainer with those options."""
    args = list(args)
    if args[:1] == ["--"]:
        args = args[1:]
    if args and not args[0].startswith("-"):
        return tuple(args)
    return (*TRAINER, *args)


def normal_nic(value: str | None) -> str | None:
    """A --network-interface value as the job uses it: a NIC name as given, a subnet in its network form
    (10.0.0.7/24 -> 10.0.0.0/24); None for nothing. Raises ValueError for a subnet that is not one."""
    if not value:
        return None
    if "/" not in value:
        return value
    return str(ipaddress.IPv4Network(value, strict=False))


@dataclass(frozen=True)
class JobOptions:
    """A job, as its user asked for it (the rules: `problems`)."""

    command: tuple[str, ...] = TRAINER
    """What every rank runs (job_command of the words after `--`): the user's command, or the bundled trainer."""
    env: tuple[str, ...] = ()
    """KEY=VALUE pairs every rank gets."""
    network_interface: str | None = None
    """The NIC the workers reach each other on, for Open MPI, NCCL and Gloo: a name every worker has, or a subnet
    (CIDR) in which each finds its own; None: each library chooses (virtual NICs left out across hosts)."""
    ssh_port: int = SSH_PORT
    """The workers' sshd port."""
    ready_timeout: float = READY_TIMEOUT_SECONDS
    """How long the job agent waits for every worker's sshd to answer."""
    stall_timeout: int = STALL_TIMEOUT_SECONDS
    """Seconds without output or new metrics after which the job counts as stalled (0: never)."""
    stall_action: str = STALL_ACTIONS[0]
    """On a stall: gather the stacks and record it (warn), or also end the job (fail)."""
    time_limit: int = 0
    """Seconds the job may run; past them every rank's stack is gathered and the job ended (exit status 124). 0:
    no limit."""
    elastic: bool = False
    """Elastic training (horovodrun, Gloo): a lost worker is dropped and the job goes on."""
    elastic_min_workers: int | None = None
    """Elastic: the job goes on while at least this many workers remain (None: 1)."""
    elastic_max_workers: int | None = None
    """Elastic: the most workers that train at once (None: all of them)."""
    elastic_timeout: int = ELASTIC_TIMEOUT_SECONDS
    """Elastic: seconds the job waits below the minimum for workers to come back before it fails."""
    restart_workers: bool = False
    """Elastic: a lost worker's container is started again and rejoins at the next discovery."""
    workdir: str | None = None
    """The folder with the user's code, copied or mounted at WORKDIR in every container, the job's working
    directory; None: the image's own code (the launcher checks this machine's folder: LaunchSettings)."""
    mounts: tuple[str, ...] = ()
    """Host folders every worker gets, HOST_PATH:CONTAINER_PATH[:ro] each."""
    spelling: Spelling = field(default=LAUNCHER_SPELLING, compare=False, repr=False)
    """How the door that made these options names them, for its errors (not part of the job)."""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "network_interface", normal_nic(self.network_interface))
        except ValueError:
            pass  # named in problems()
        object.__setattr__(self, "command", tuple(self.command))
        found = self.problems()
        if found:
            raise SettingsError(*found)

    def problems(self) -> list[str]:
        """Every rule about a job's options: one line per problem, naming the setting and the fix."""
        say = self.spelling
        found: list[str] = []
        if not self.command:
            found.append("no command for the ranks to run: name one after `--`, or leave it out for the trainer")
        found += [f"{problem}; {say.fix_for('env')}" for item in self.env if (problem := env_problem(item))]
        nic = self.network_interface
        if nic and "/" in nic:
            try:
                ipaddress.IPv4Network(nic, strict=False)
            except ValueError:
                found.append(
                    f"{say.of('network_interface', repr(nic))} is neither a NIC name nor an IPv4 subnet in CIDR "
                    "form: pass e.g. eth0 or 10.0.0.0/24"
                )
        if not 1 <= self.ssh_port <= 65535:
            found.append(f"{say.of('ssh_port', self.ssh_port)} is not a TCP port (1-65535); {say.fix_for('ssh_port')}")
        if self.ready_timeout <= 0:
            found.append(
                f"{say.of('ready_timeout', self.ready_timeout)} is not positive seconds; "
                + say.fix_for("ready_timeout")
            )
        if self.stall_timeout < 0:
            found.append(
                f"{say.of('stall_timeout', self.stall_timeout)} is neither 0 (off) nor positive seconds; "
                + say.fix_for("stall_timeout")
            )
        if self.stall_action not in STALL_ACTIONS:
            found.append(
                f"{say.of('stall_action', repr(self.stall_action))} is not one of {', '.join(STALL_ACTIONS)}; "
                + say.fix_for("stall_action")
            )
        if self.time_limit < 0:
            found.append(
                f"{say.of('time_limit', self.time_limit)} is neither 0 (no limit) nor positive seconds; "
                + say.fix_for("time_limit")
            )
        found += self._elastic_problems()
        for text in self.mounts:
            try:
                parse_bind(text)
            except ValueError as error:
                found.append(str(error).replace("--mount", say.of("mounts"), 1))
        return found

    def _elastic_problems(self) -> list[str]:
        say = self.spelling
        if not self.elastic:
            given = [name for name in ("elastic_min_workers", "elastic_max_workers") if getattr(self, name) is not None]
            given += ["restart_workers"] if self.restart_workers else []
            return [f"{say.of(name)} is for elastic jobs: add {say.of('elastic')}" for name in given]
        found = []
        if self.min_workers < 1:
            minimum = say.of("elastic_min_workers", self.min_workers)
            found.append(f"{minimum} is not 1 or more; {say.fix_for('elastic_min_workers')}")
        if self.elastic_max_workers is not None and self.elastic_max_workers < self.min_workers:
            found.append(
                f"{say.of('elastic_max_workers', self.elastic_max_workers)} is not from "
                f"{say.of('elastic_min_workers')} ({self.min_workers}) up; {say.fix_for('elastic_max_workers')}"
            )
        if self.elastic_timeout <= 0:
            found.append(
                f"{say.of('elastic_timeout', self.elastic_timeout)} is not positive seconds; "
                + say.fix_for("elastic_timeout")
            )
        if not self.network_interface:
            # Without it horovodrun probes every host pair for common NICs and, with all slots on one host, waits
            # for that probe until it times out.
            found.append(
                f"elastic training needs the NIC the workers reach each other on: pass "
                f"{say.of('network_interface')} (e.g. eth0; `ip -br addr` on a node lists them)"
            )
        return found

    def workers_problem(self, workers: int) -> str | None:
        """Why the elastic sizes do not fit a job of `workers` workers (the door's count: its nodes, compose's
        WORKERS, the MPIJob's worker pods); None if they do."""
        say = self.spelling
        if not self.elastic:
            return None
        if not self.min_workers <= workers:
            return (
                f"{say.of('elastic_min_workers', self.min_workers)} is not from 1 to the {workers} "
                f"{say.of('workers')}; {say.fix_for('elastic_min_workers')}"
            )
        if self.elastic_max_workers is not None and self.elastic_max_workers > workers:
            return (
                f"{say.of('elastic_max_workers', self.elastic_max_workers)} is not from "
                f"{say.of('elastic_min_workers')} ({self.min_workers}) to the {workers} {say.of('workers')}; "
                + say.fix_for("elastic_max_workers")
            )
        return None

    @property
    def min_workers(self) -> int:
        """Elastic: the fewest workers the job goes on with."""
        return 1 if self.elastic_min_workers is None else self.elastic_min_workers

    @property
    def binds(self) -> tuple[Bind, ...]:
        return tuple(parse_bind(text) for text in self.mounts)

    def to_dict(self) -> dict:
        """The options as JSON takes them (the spelling is the door's, not the job's)."""
        return {item.name: getattr(self, item.name) for item in fields(self) if item.name != "spelling"}

    @classmethod
    def from_dict(cls, data: Mapping) -> JobOptions:
        known = {item.name for item in fields(cls)} - {"spelling"}
        values = {key: value for key, value in data.items() if key in known}  # a newer launcher's extras
        for key in ("command", "env", "mounts"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)
