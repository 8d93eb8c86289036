"""One job's options, whichever launch method runs it: the command, its environment, the NIC, the SSH port, the
timeouts, the stall and elastic settings, the user's code and folders. Validated once, at construction; every rule about
a job's options is here and nowhere else, and each error names the setting as the launch method's users write it (a
flag, an .env key, an MPIJob export option) and the fix.

A launch method builds one JobOptions from what its users set (the launcher from .env and flags, compose from its
environment, the MPIJob launch method from its arguments); the job spec the agent runs carries it (core.jobspec).
Adding an option is one field here and its rule in `problems`; its launcher flag is the field's option(flag=, key=,
help=), from which launcher/host/planning/flags.py makes `launcher start`'s parameter, its --help and its home.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import UnionType
from typing import Any, get_args, get_origin, get_type_hints

from app.entrypoint import TRAINER
from launcher.core.mounts import Bind, bind_problem, parse_bind
from launcher.core.nics import NIC_SETTING
from launcher.core.option_names import OptionNames
from launcher.core.protocol import ELASTIC_TIMEOUT_SECONDS, READY_TIMEOUT_SECONDS, SSH_PORT, STALL_TIMEOUT_SECONDS
from launcher.core.stall import STALL_ACTIONS

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SettingsError(ValueError):
    """Settings a launch method refuses: one line per problem, each naming the setting and the fix."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


def one_line(error: Exception) -> str:
    """An error as one line (a job-end message is one line: JOB_STATUS, the agent's last line to a worker)."""
    return "; ".join(error.problems) if isinstance(error, SettingsError) else " ".join(str(error).split())


LAUNCH_METHODS = ("launcher", "compose", "mpijob")
"""The launch methods that build JobOptions: the multi-host launcher, compose's launcher service, the MPIJob export and
its launcher pod. Each names the options its own way (`option`)."""


def option(
    default: object,
    *,
    flag: str | None = None,
    key: str | None = None,
    compose: str | None = None,
    mpijob: str | None = None,
    help: str | None = None,
    shown: str | None = None,
) -> Any:
    """A JobOptions field and how each launch method's users set it: the launcher's `flag` and its .env `key`, compose's
    .env key, `launcher export mpijob`'s flag (which the MPIJob's launcher pod reads back). `help` is the launcher
    flag's --help text (launcher/host/planning/flags.py makes `start`'s parameter and its `(default: ...)` from this
    row); `shown`: how that help words the default where it is not the default itself (e.g. `0: never`)."""
    meta = {"flag": flag, "key": key, "compose": compose, "mpijob": mpijob, "help": help, "shown": shown}
    return field(default=default, metadata=meta)


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
    env: tuple[str, ...] = option(
        (), flag="--env", compose="the environment", mpijob="--env", help="KEY=VALUE for every rank (repeatable)."
    )
    """KEY=VALUE pairs every rank gets."""
    secrets: tuple[str, ...] = option(
        (),
        flag="--secret",
        key="SECRETS",
        mpijob="--secret",
        help="NAME of a secret setting (an API key, a token) every rank gets, its value taken from this machine's "
        "environment or .env and never shown: not on a command line, in a log or in the plan (repeatable).",
    )
    """Names of variables every rank gets whose values are secret (API keys, tokens): the values travel apart from the
    job (a 0600 file in rank 0's container, read and removed by the agent; an MPIJob's Kubernetes Secret) and reach
    the ranks through mpirun's environment (`-x NAME`) or elastic horovodrun's (inherited, or sent over ssh's own
    channel: docker/horovod-runner/patch.py), never a command line, a log or job.json."""
    network_interface: str | None = option(
        None,
        flag="--network-interface",
        key=NIC_SETTING,
        compose="NETWORK_INTERFACE",
        mpijob="--network-interface",
        help="The nodes' NIC for Open MPI, NCCL and Gloo: a name every node has (eth0), or a subnet (10.0.0.0/24) "
        "where the names differ: each node uses its NIC in it.",
        shown="none: virtual NICs left out",
    )
    """The NIC the workers reach each other on, for Open MPI, NCCL and Gloo: a name every worker has, or a subnet
    (CIDR) in which each finds its own; None: each library chooses (virtual NICs left out across hosts)."""
    ssh_port: int = option(
        SSH_PORT, flag="--ssh-port", key="SSH_PORT", compose="SSH_PORT", help="Port of the workers' sshd."
    )
    """The workers' sshd port."""
    ready_timeout: float = option(
        READY_TIMEOUT_SECONDS, key="READY_TIMEOUT", compose="READY_TIMEOUT", mpijob="--schedule-timeout"
    )
    """How long the job agent waits for every worker's sshd to answer (an MPIJob's: inf unless --schedule-timeout,
    as long as its worker pods may be scheduled)."""
    stall_timeout: int = option(
        STALL_TIMEOUT_SECONDS,
        flag="--stall-timeout",
        key="STALL_TIMEOUT",
        compose="STALL_TIMEOUT",
        help="Seconds without output or new metrics before the job counts as stalled: every rank's stack goes into "
        "its log and `launcher status` says so.",
        shown=f"{STALL_TIMEOUT_SECONDS}; 0: off",
    )
    """Seconds without output or new metrics after which the job counts as stalled (0: never)."""
    stall_action: str = option(
        STALL_ACTIONS[0],
        flag="--stall-action",
        key="STALL_ACTION",
        compose="STALL_ACTION",
        help="On a stall: warn (the job goes on) or fail (it ends with the stall as its error).",
    )
    """On a stall: gather the stacks and record it (warn), or also end the job (fail)."""
    time_limit: int = option(
        0,
        flag="--time-limit",
        key="TIME_LIMIT",
        compose="TIME_LIMIT",
        help="Seconds the job may run: past them every rank's stack goes into its log and the job is ended, exit "
        "status 124, with the limit as its error.",
        shown="0: no limit",
    )
    """Seconds the job may run; past them every rank's stack is gathered and the job ended (exit status 124). 0:
    no limit."""
    elastic: bool = option(
        False,
        flag="--elastic",
        compose="ELASTIC_MIN_WORKERS",
        mpijob="--elastic",
        help="Elastic training (horovodrun, Gloo): a node whose worker is lost is dropped and the job goes on; needs "
        "--network-interface.",
    )
    """Elastic training (horovodrun, Gloo): a lost worker is dropped and the job goes on."""
    elastic_min_workers: int | None = option(
        None,
        flag="--min-nodes",
        compose="ELASTIC_MIN_WORKERS",
        mpijob="--min-workers",
        help="With --elastic: the fewest nodes the job goes on with (default 1). With --max-restarts: the fewest nodes "
        "a restart may run on (default: all; a lost node's worker is waited for).",
    )
    """Elastic: the job goes on while at least this many workers remain (None: 1). A fixed-size job with
    max_restarts: the fewest workers a restart may run on (None: all of them, the lost ones waited for)."""
    elastic_max_workers: int | None = option(
        None, flag="--max-nodes", help="With --elastic: the most nodes that train at once.", shown="all"
    )
    """Elastic: the most workers that train at once (None: all of them)."""
    elastic_timeout: int = option(
        ELASTIC_TIMEOUT_SECONDS,
        flag="--elastic-timeout",
        key="ELASTIC_TIMEOUT",
        compose="ELASTIC_TIMEOUT",
        help="With --elastic: seconds the job waits below --min-nodes for lost workers to come back before it fails.",
    )
    """Elastic: seconds the job waits below the minimum for workers to come back before it fails."""
    restart_workers: bool = option(
        False,
        flag="--restart-workers",
        help="With --elastic: a worker container that fails (a crash, the kernel's out-of-memory kill) is started "
        "again by its node's Docker engine and rejoins at the next host discovery, attached or --detach.",
    )
    """Elastic: a worker container that failed is started again by its node's engine (a restart policy: no launcher
    needed) and rejoins at the next discovery."""
    worker_restarts: int = option(
        5,
        flag="--worker-restarts",
        key="WORKER_RESTARTS",
        help="With --restart-workers: how often each node's engine starts its failed worker again at most.",
    )
    """With restart_workers: how often each node's engine starts its failed worker again at most."""
    max_restarts: int = option(
        0,
        flag="--max-restarts",
        key="MAX_RESTARTS",
        compose="MAX_RESTARTS",
        help="A fixed-size job that loses a node is started again this many times at most by its agent, resuming from "
        "the newest checkpoint in the shared folder (the bundled trainer with --resume; a script of yours: "
        "HOROVOD_STACK_RESTART and HOROVOD_STACK_CHECKPOINT_DIR); a failure of the script itself, once at most.",
        shown="0: never",
    )
    """A fixed-size job that lost a node is started again this many times at most, by its agent, from the newest
    checkpoint in the shared folder (launcher/core/restart.py); with elastic_min_workers (--min-nodes) on fewer
    nodes. 0: never (can_restart)."""
    ptrace: bool = option(
        True,
        flag="--no-ptrace",
        key="PTRACE",
        mpijob="--ptrace",
        help="Start the workers without SYS_PTRACE, for clusters that forbid it: no stacks (`launcher stacks`, a "
        "stall, the time limit).",
        shown="with it",
    )
    """Workers get SYS_PTRACE, with which py-spy reads the ranks' stacks (`launcher stacks`, a stall, the time limit);
    False (--no-ptrace, for clusters that forbid it; an MPIJob's default, as Pod Security's baseline profile forbids
    it): no stacks, and no new privileges in the workers."""
    timeline: bool = option(
        False,
        flag="--timeline",
        key="TIMELINE",
        compose="TIMELINE",
        help="Rank 0 writes Horovod's timeline into the run folder (timeline.json; `launcher results` brings it home; "
        "open it in https://ui.perfetto.dev or chrome://tracing).",
    )
    """Rank 0's Horovod timeline (HOROVOD_TIMELINE) written into the run folder as timeline.json."""
    autotune: bool = option(
        False,
        flag="--autotune",
        key="AUTOTUNE",
        compose="AUTOTUNE",
        help="Horovod's autotuning of the fusion threshold, cycle time and more while the job trains; its log and what "
        "it chose go into the run folder (autotune.csv, autotune.json).",
    )
    """Horovod's autotuning (HOROVOD_AUTOTUNE) on, its log in the run folder (autotune.csv) and what it chose beside
    it (autotune.json)."""
    workdir: str | None = option(
        None,
        flag="--workdir",
        compose="WORKDIR",
        help="Local folder with your code, copied to /workdir on every node; the command runs there.",
    )
    """The folder with the user's code, copied or mounted at WORKDIR in every container, the job's working
    directory; None: the image's own code (the launcher checks this machine's folder: LaunchSettings)."""
    mounts: tuple[str, ...] = option(
        (),
        flag="--mount",
        key="MOUNTS",
        help="A host folder for every worker, HOST_PATH:CONTAINER_PATH[:ro] (repeatable), e.g. a dataset at the same "
        "path on every node: /data/mnist:/data:ro.",
    )
    """Host folders every worker gets, HOST_PATH:CONTAINER_PATH[:ro] each."""
    launch_method: str = field(default=LAUNCH_METHODS[0], compare=False)
    """The launch method that made these options (`LAUNCH_METHODS`): how its errors name them, here and in the agent."""

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
        if self.launch_method not in LAUNCH_METHODS:
            return [f"JobOptions of an unknown launch method {self.launch_method!r} (not one of {LAUNCH_METHODS})"]
        say = self.option_names
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
        say = self.option_names
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
        say = self.option_names
        if not self.elastic:
            return self._restart_problems()
        if self.can_restart:
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
        say = self.option_names
        if self.max_restarts < 0:
            count = say.of("max_restarts", self.max_restarts)
            return [f"{count} is neither 0 (off) nor a positive count; {say.fix_for('max_restarts')}"]
        if self.worker_restarts < 1 and "worker_restarts" in say.names:
            count = say.of("worker_restarts", self.worker_restarts)
            return [f"{count} is not 1 or more; {say.fix_for('worker_restarts')}"]
        given = ["elastic_min_workers"] if self.elastic_min_workers is not None and not self.can_restart else []
        given += ["elastic_max_workers"] if self.elastic_max_workers is not None else []
        given += ["restart_workers"] if self.restart_workers else []
        found = [f"{say.of(name)} is for elastic jobs: add {say.of('elastic')}" for name in given]
        if "elastic_min_workers" in given and "max_restarts" in say.names:
            found[0] += f" (or {say.of('max_restarts', 'N')}: a fixed-size job restarted on fewer nodes)"
        if self.can_restart and self.elastic_min_workers is not None and self.elastic_min_workers < 1:
            minimum = say.of("elastic_min_workers", self.elastic_min_workers)
            found.append(f"{minimum} is not 1 or more; {say.fix_for('elastic_min_workers')}")
        return found

    def workers_problem(self, workers: int) -> str | None:
        """Why the elastic sizes do not fit a job of `workers` workers (the launch method's count: its nodes, compose's
        WORKERS, the MPIJob's worker pods); None if they do."""
        say = self.option_names
        if not self.elastic and not (self.can_restart and self.elastic_min_workers is not None):
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
    def option_names(self) -> OptionNames:
        """How this launch method's users set each option (OPTION_NAMES)."""
        return OPTION_NAMES[self.launch_method]

    @property
    def can_restart(self) -> bool:
        """A fixed-size job its agent starts again after a lost node (max_restarts): one home for that question."""
        return self.max_restarts > 0

    @property
    def min_workers(self) -> int:
        """Elastic: the fewest workers the job goes on with."""
        return 1 if self.elastic_min_workers is None else self.elastic_min_workers

    def fell_below(self, lost: str) -> str:
        """The one sentence for an elastic job that lost more nodes than it may: `lost` names them (and why)."""
        minimum = self.option_names.of("elastic_min_workers", self.min_workers)
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


def launch_method_names(launch_method: str) -> dict[str, str]:
    """How `launch_method`'s users set each option (option's metadata); the launcher's flags, else its .env keys."""
    names = {}
    for item in fields(JobOptions):
        meta = item.metadata
        name = (meta.get("flag") or meta.get("key")) if launch_method == "launcher" else meta.get(launch_method)
        if name:
            names[item.name] = name
    return names


OPTION_NAMES = {
    "launcher": OptionNames({**launch_method_names("launcher"), "workers": "node(s) in --nodes"}),
    "compose": OptionNames({**launch_method_names("compose"), "workers": "workers in WORKERS"}),
    "mpijob": OptionNames(
        {**launch_method_names("mpijob"), "workers": "worker pods (--workers)"},
        flag_fix="pass {name} to `launcher export mpijob` with one that is",
    ),
}
"""Each launch method's names for the options, for the errors JobOptions and the job agent word."""
