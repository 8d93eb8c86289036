"""One job's options, whichever launch method runs it: the command, its environment, the NIC, the SSH port, the
timeouts, the stall and elastic settings, the user's code and folders. Validated once, at construction; every rule about
a job's options is here and nowhere else, and each error names the setting as the launch method's users write it (a
flag, an .env key, an MPIJob export option) and the fix.

A launch method builds one JobOptions from what its users set (the launcher from .env and flags, compose from its
environment, the MPIJob launch method from its arguments); the job spec the agent runs carries it (launcher.core.job).
Adding an option is one field here, its rule in `problems`, and the flag that sets it.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import UnionType
from typing import Any, get_args, get_origin, get_type_hints

from app.entrypoint import TRAINER
from launcher.core.nics import NIC_SETTING
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

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
STACK_PATHS = (HOME, "/cluster", "/opt/horovod-stack", "/opt/venv")
"""The stack's own files in a worker (its user's home and job files, the cluster's SSH trust, its code, its Python): a
mount may go neither at, under nor above them, so no job can replace a key, the agent or the interpreter."""
JOB_FOLDERS = (SHARED_MOUNT, WORKDIR)
"""The job's folders: a mount may go inside them (a dataset at /shared/data) but neither replace nor cover them."""
SYSTEM_PATHS = ("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/proc", "/sys", "/dev")
"""The system's folders, which no mount may be at or under (/bin, /sbin and /lib are /usr's under merged /usr)."""
MOUNT_FIX = "mount it elsewhere, e.g. /data"


class SettingsError(ValueError):
    """Settings a launch method refuses: one line per problem, each naming the setting and the fix."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


def one_line(error: Exception) -> str:
    """An error as one line (a job-end message is one line: JOB_STATUS, the agent's last line to a worker)."""
    return "; ".join(error.problems) if isinstance(error, SettingsError) else " ".join(str(error).split())


DOORS = ("launcher", "compose", "mpijob")
"""The launch methods that build JobOptions: the multi-host launcher, compose's launcher service, the MPIJob export and
its launcher pod. Each names the options its own way (`option`)."""


def option(
    default: object,
    *,
    flag: str | None = None,
    key: str | None = None,
    compose: str | None = None,
    mpijob: str | None = None,
) -> Any:
    """A JobOptions field and how each launch method's users set it: the launcher's `flag` and its .env `key`, compose's
    .env key, `launcher export mpijob`'s flag (which the MPIJob's launcher pod reads back)."""
    return field(default=default, metadata={"flag": flag, "key": key, "compose": compose, "mpijob": mpijob})


@dataclass(frozen=True)
class Spelling:
    """How one launch method's users write each option, for its errors: a flag (`--ssh-port 70000`, fixed by passing it
    again) or a settings file's key (`SSH_PORT=70000`, fixed in .env)."""

    names: Mapping[str, str]
    """JobOptions field -> how it is set (`--ssh-port`, `SSH_PORT`); "workers": what counts the launch method's
    workers."""
    flag_fix: str = "pass {name} with one that is"

    def of(self, option: str, value: object = None) -> str:
        name = self.names.get(option, option)
        if value is None:
            return name
        return f"{name} {value}" if name.startswith("-") else f"{name}={value}"

    def fix_for(self, option: str) -> str:
        name = self.of(option)
        return self.flag_fix.format(name=name) if name.startswith("-") else "fix it in .env"


@dataclass(frozen=True)
class Bind:
    """A host folder in every worker (--mount HOST_PATH:CONTAINER_PATH[:ro]), e.g. a dataset on each node's disk."""

    source: str
    target: str
    read_only: bool = False

    def __str__(self) -> str:
        return f"{self.source} -> {self.target}{' (read-only)' if self.read_only else ''}"


def bind_problem(text: str, name: str = "--mount") -> str | None:
    """Why `text` is not HOST_PATH:CONTAINER_PATH[:ro|rw], both absolute, its target (normalised: /data/../cluster is
    /cluster) clear of the stack's and the system's folders; None if it is. `name`: how the launch method's users set
    it."""
    parts = text.split(":")
    if len(parts) == 3 and parts[2] in ("ro", "rw"):
        parts.pop()
    if len(parts) != 2 or not all(part.startswith("/") for part in parts):
        return f"{name} {text!r} is not HOST_PATH:CONTAINER_PATH[:ro], both absolute: e.g. /data:/data:ro"
    target = container_path(parts[1])
    problem = target_problem(target)
    if problem is None:
        return None
    normalised = f" (target {target})" if target != parts[1] else ""
    return f"{name} {text!r}{normalised} {problem}: {MOUNT_FIX}"


def target_problem(target: str) -> str | None:
    """Why a worker's normalised path `target` may not take a mount; None if it may."""
    if target == "/":
        return "would hide the whole container"
    covered = next((path for path in (*STACK_PATHS, *JOB_FOLDERS) if is_at_or_under(path, target)), None)
    if covered:
        return f"would hide the stack's own {covered}"
    inside = next((path for path in STACK_PATHS if is_at_or_under(target, path)), None)
    if inside:
        return f"is inside the stack's own {inside}"
    system = next((path for path in SYSTEM_PATHS if is_at_or_under(target, path)), None)
    if system:
        return f"is in the system's {system}"
    return None


def container_path(text: str) -> str:
    """An absolute path as the container resolves it, without `.`, `..` or repeated slashes."""
    return "/" + posixpath.normpath(text).lstrip("/")  # normpath keeps a leading "//"


def is_at_or_under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def parse_bind(text: str) -> Bind:
    """The Bind a valid mount (bind_problem) names, both paths normalised; raises ValueError naming the fix for one
    that is not."""
    problem = bind_problem(text)
    if problem:
        raise ValueError(problem)
    parts = text.split(":")
    return Bind(container_path(parts[0]), container_path(parts[1]), parts[2:] == ["ro"])


def env_problem(item: str, name: str = "--env") -> str | None:
    """Why `item` is not KEY=VALUE for a rank's environment; None if it is. `name`: how the launch method's users set
    it."""
    key, separator, _ = item.partition("=")
    if not separator or not ENV_NAME.fullmatch(key):
        return f"{name} {item!r} is not KEY=VALUE with a variable name as KEY"
    return None


def names_in(env: tuple[str, ...]) -> frozenset[str]:
    """The variables that KEY=VALUE pairs set."""
    return frozenset(item.partition("=")[0] for item in env)


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

    command: tuple[str, ...] = option(TRAINER)
    """What every rank runs (job_command of the words after `--`): the user's command, or the bundled trainer."""
    env: tuple[str, ...] = option((), flag="--env", compose="the environment", mpijob="--env")
    """KEY=VALUE pairs every rank gets."""
    secrets: tuple[str, ...] = option((), flag="--secret", key="SECRETS", mpijob="--secret")
    """Names of variables every rank gets whose values are secret (API keys, tokens): the values travel apart from the
    job (a 0600 file in rank 0's container, read and removed by the agent; an MPIJob's Kubernetes Secret) and reach
    the ranks through mpirun's environment (`-x NAME`) or elastic horovodrun's (inherited, or sent over ssh's own
    channel: docker/horovod-runner/patch.py), never a command line, a log or job.json."""
    network_interface: str | None = option(
        None, flag="--network-interface", key=NIC_SETTING, compose="NETWORK_INTERFACE", mpijob="--network-interface"
    )
    """The NIC the workers reach each other on, for Open MPI, NCCL and Gloo: a name every worker has, or a subnet
    (CIDR) in which each finds its own; None: each library chooses (virtual NICs left out across hosts)."""
    ssh_port: int = option(SSH_PORT, flag="--ssh-port", key="SSH_PORT", compose="SSH_PORT")
    """The workers' sshd port."""
    ready_timeout: float = option(
        READY_TIMEOUT_SECONDS, key="READY_TIMEOUT", compose="READY_TIMEOUT", mpijob="--schedule-timeout"
    )
    """How long the job agent waits for every worker's sshd to answer (an MPIJob's: inf unless --schedule-timeout,
    as long as its worker pods may be scheduled)."""
    stall_timeout: int = option(
        STALL_TIMEOUT_SECONDS, flag="--stall-timeout", key="STALL_TIMEOUT", compose="STALL_TIMEOUT"
    )
    """Seconds without output or new metrics after which the job counts as stalled (0: never)."""
    stall_action: str = option(STALL_ACTIONS[0], flag="--stall-action", key="STALL_ACTION", compose="STALL_ACTION")
    """On a stall: gather the stacks and record it (warn), or also end the job (fail)."""
    time_limit: int = option(0, flag="--time-limit", key="TIME_LIMIT", compose="TIME_LIMIT")
    """Seconds the job may run; past them every rank's stack is gathered and the job ended (exit status 124). 0:
    no limit."""
    elastic: bool = option(False, flag="--elastic", compose="ELASTIC_MIN_WORKERS", mpijob="--elastic")
    """Elastic training (horovodrun, Gloo): a lost worker is dropped and the job goes on."""
    elastic_min_workers: int | None = option(
        None, flag="--min-nodes", compose="ELASTIC_MIN_WORKERS", mpijob="--min-workers"
    )
    """Elastic: the job goes on while at least this many workers remain (None: 1). A fixed-size job with
    max_restarts: the fewest workers a restart may run on (None: all of them, the lost ones waited for)."""
    elastic_max_workers: int | None = option(None, flag="--max-nodes")
    """Elastic: the most workers that train at once (None: all of them)."""
    elastic_timeout: int = option(ELASTIC_TIMEOUT_SECONDS, key="ELASTIC_TIMEOUT", compose="ELASTIC_TIMEOUT")
    """Elastic: seconds the job waits below the minimum for workers to come back before it fails."""
    restart_workers: bool = option(False, flag="--restart-workers")
    """Elastic: a worker container that failed is started again by its node's engine (a restart policy: no launcher
    needed) and rejoins at the next discovery."""
    worker_restarts: int = option(5, flag="--worker-restarts", key="WORKER_RESTARTS")
    """With restart_workers: how often each node's engine starts its failed worker again at most."""
    max_restarts: int = option(0, flag="--max-restarts", key="MAX_RESTARTS", compose="MAX_RESTARTS")
    """A fixed-size job that lost a node is started again this many times at most, by its agent, from the newest
    checkpoint in the shared folder (launcher/core/restart.py); with elastic_min_workers (--min-nodes) on fewer
    nodes. 0: never."""
    ptrace: bool = option(True, flag="--no-ptrace", key="PTRACE", mpijob="--ptrace")
    """Workers get SYS_PTRACE, with which py-spy reads the ranks' stacks (`launcher stacks`, a stall, the time limit);
    False (--no-ptrace, for clusters that forbid it; an MPIJob's default, as Pod Security's baseline profile forbids
    it): no stacks, and no new privileges in the workers."""
    timeline: bool = option(False, flag="--timeline", key="TIMELINE", compose="TIMELINE")
    """Rank 0's Horovod timeline (HOROVOD_TIMELINE) written into the run folder as timeline.json."""
    autotune: bool = option(False, flag="--autotune", key="AUTOTUNE", compose="AUTOTUNE")
    """Horovod's autotuning (HOROVOD_AUTOTUNE) on, its log in the run folder (autotune.csv) and what it chose beside
    it (autotune.json)."""
    workdir: str | None = option(None, flag="--workdir", compose="WORKDIR")
    """The folder with the user's code, copied or mounted at WORKDIR in every container, the job's working
    directory; None: the image's own code (the launcher checks this machine's folder: LaunchSettings)."""
    mounts: tuple[str, ...] = option((), flag="--mount", key="MOUNTS")
    """Host folders every worker gets, HOST_PATH:CONTAINER_PATH[:ro] each."""
    door: str = field(default=DOORS[0], compare=False)
    """The launch method that made these options (`DOORS`): how its errors name them, here and in the job agent."""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "network_interface", normal_nic(self.network_interface))
        except ValueError:
            pass  # named in problems()
        for name in ("command", "env", "secrets", "mounts"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        found = self.problems()
        if found:
            raise SettingsError(*found)

    def problems(self) -> list[str]:
        """Every rule about a job's options: one line per problem, naming the setting and the fix."""
        if self.door not in DOORS:
            return [f"JobOptions from an unknown launch method {self.door!r}: one of {', '.join(DOORS)} builds them"]
        say = self.spelling
        found: list[str] = []
        if not self.command:
            found.append("no command for the ranks to run: name one after `--`, or leave it out for the trainer")
        found += [
            f"{problem}; {say.fix_for('env')}" for item in self.env if (problem := env_problem(item, say.of("env")))
        ]
        found += self._secret_problems()
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
        found += [problem for text in self.mounts if (problem := bind_problem(text, say.of("mounts")))]
        return found

    def _secret_problems(self) -> list[str]:
        say = self.spelling
        found = [
            f"{say.of('secrets', repr(name))} is not a variable name; {say.fix_for('secrets')}"
            for name in self.secrets
            if not ENV_NAME.fullmatch(name)
        ]
        found += [
            f"{name} is both a secret ({say.of('secrets')}) and in {say.of('env')}: drop it from {say.of('env')}"
            for name in sorted(set(self.secrets) & names_in(self.env))
        ]
        return found

    def _elastic_problems(self) -> list[str]:
        say = self.spelling
        if not self.elastic:
            return self._restart_problems()
        if self.max_restarts:
            return [
                f"{say.of('max_restarts', self.max_restarts)} is for fixed-size jobs: an elastic job goes on without "
                f"a lost node by itself; drop {say.of('max_restarts')}, or drop {say.of('elastic')} to have a "
                "fixed-size job restarted"
            ]
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

    def _restart_problems(self) -> list[str]:
        """A fixed-size job's: the elastic settings are refused, but for --min-nodes with --max-restarts."""
        say = self.spelling
        if self.max_restarts < 0:
            count = say.of("max_restarts", self.max_restarts)
            return [f"{count} is neither 0 (off) nor a positive count; {say.fix_for('max_restarts')}"]
        if self.worker_restarts < 1 and "worker_restarts" in say.names:
            count = say.of("worker_restarts", self.worker_restarts)
            return [f"{count} is not 1 or more; {say.fix_for('worker_restarts')}"]
        given = ["elastic_min_workers"] if self.elastic_min_workers is not None and not self.max_restarts else []
        given += ["elastic_max_workers"] if self.elastic_max_workers is not None else []
        given += ["restart_workers"] if self.restart_workers else []
        found = [f"{say.of(name)} is for elastic jobs: add {say.of('elastic')}" for name in given]
        if "elastic_min_workers" in given and "max_restarts" in say.names:
            found[0] += f" (or {say.of('max_restarts', 'N')}: a fixed-size job restarted on fewer nodes)"
        if self.max_restarts and self.elastic_min_workers is not None and self.elastic_min_workers < 1:
            minimum = say.of("elastic_min_workers", self.elastic_min_workers)
            found.append(f"{minimum} is not 1 or more; {say.fix_for('elastic_min_workers')}")
        return found

    def workers_problem(self, workers: int) -> str | None:
        """Why the elastic sizes do not fit a job of `workers` workers (the launch method's count: its nodes, compose's
        WORKERS, the MPIJob's worker pods); None if they do."""
        say = self.spelling
        if not self.elastic and not (self.max_restarts and self.elastic_min_workers is not None):
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
    def spelling(self) -> Spelling:
        """How this launch method's users set each option (SPELLINGS)."""
        return SPELLINGS[self.door]

    @property
    def min_workers(self) -> int:
        """Elastic: the fewest workers the job goes on with."""
        return 1 if self.elastic_min_workers is None else self.elastic_min_workers

    def fell_below(self, lost: str) -> str:
        """The one sentence for an elastic job that lost more nodes than it may: `lost` names them (and why)."""
        minimum = self.spelling.of("elastic_min_workers", self.min_workers)
        return f"the elastic job fell below {minimum} for {self.elastic_timeout} s: lost {lost}"

    @property
    def binds(self) -> tuple[Bind, ...]:
        return tuple(parse_bind(text) for text in self.mounts)

    def to_dict(self) -> dict:
        """The options as JSON takes them."""
        return {item.name: getattr(self, item.name) for item in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping) -> JobOptions:
        known = {item.name for item in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})  # a newer launcher's extras


SWITCH_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def switch(text: str, key: str) -> bool:
    """A settings file's on/off value (1, true, yes, on; 0, false, no, off; any case); SettingsError naming `key`
    and the fix for anything else."""
    value = SWITCH_WORDS.get(text.strip().lower())
    if value is None:
        raise SettingsError(f"{key}={text} is neither 1 (on) nor 0 (off); fix it in .env")
    return value


def option_kind(name: str) -> type:
    """What a settings file's text becomes for option `name`: str, int, float, bool or tuple (a list)."""
    hint = get_type_hints(JobOptions)[name]
    kinds = [kind for kind in get_args(hint) if kind is not type(None)] if get_origin(hint) is UnionType else [hint]
    return next(
        wanted for wanted in (bool, int, float, tuple, str) for kind in kinds if (get_origin(kind) or kind) is wanted
    )


def door_names(door: str) -> dict[str, str]:
    """How `door`'s users set each option (option's metadata); the launcher's flags, else its .env keys."""
    names = {}
    for item in fields(JobOptions):
        meta = item.metadata
        name = (meta.get("flag") or meta.get("key")) if door == "launcher" else meta.get(door)
        if name:
            names[item.name] = name
    return names


SPELLINGS = {
    "launcher": Spelling({**door_names("launcher"), "workers": "node(s) in --nodes"}),
    "compose": Spelling({**door_names("compose"), "workers": "workers in WORKERS"}),
    "mpijob": Spelling(
        {**door_names("mpijob"), "workers": "worker pods (--workers)"},
        flag_fix="pass {name} to `launcher export mpijob` with one that is",
    ),
}
"""Each launch method's spelling, for the errors JobOptions and the job agent word."""
