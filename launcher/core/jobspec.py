"""One job as the job agent runs it, whichever launch method made it: its options (launcher.core.options), where its
workers are, and how it ends; and the command lines built from it (mpirun over a hostfile, or elastic horovodrun over
the agent's host discovery), the hostfile, and the ssh client settings every connection into the cluster uses.

Pure functions of their inputs, so every line mpirun will see is unit-tested. A command line is built only from a
valid JobSpec, so building one never fails.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath as Path

from app import rank_error
from app.autotune import LOG as AUTOTUNE_LOG
from app.config import laid_out_paths
from app.entrypoint import TRAINER
from app.gpu import gpu_rank_env
from app.horovod_defaults import HOROVOD_DEFAULTS
from app.timeline import FILE as TIMELINE_FILE
from launcher.core.mpiports import port_selection
from launcher.core.nics import NIC_VARIABLES, nic_selection, nic_variables, subnet_of
from launcher.core.options import JobOptions, SettingsError, names_in
from launcher.core.protocol import (
    CHECKPOINT_DIR_VARIABLE,
    CLUSTER_KEY,
    DISCOVERY_SCRIPT,
    HOME,
    HOSTFILE_PATH,
    KEEPALIVE_COUNT,
    KEEPALIVE_INTERVAL_SECONDS,
    KNOWN_HOSTS,
    RANK_NIC,
    RESTART_VARIABLE,
    SSH_CONNECT_TIMEOUT_SECONDS,
    WORKDIR,
    WORKER_CLAIM_TIMEOUT_SECONDS,
)
from launcher.core.ranktag import TAG_OUTPUT

ELASTIC_GLOO_TIMEOUT_SECONDS = 10
"""How long a rank waits on a silent peer before its collective fails (Horovod's default: 30 s). A killed worker's
peers often get no TCP reset, so this bounds how soon an elastic job notices the loss; --env
HOROVOD_GLOO_TIMEOUT_SECONDS=N overrides it for steps where ranks legitimately wait longer."""
ELASTIC_RENDEZVOUS_TIMEOUT_SECONDS = 120
"""How long a rank waits at a Gloo rendezvous for a peer that is still starting
(HOROVOD_STACK_RENDEZVOUS_TIMEOUT_SECONDS, docker/patch-horovod-source.sh). horovodrun starts a joining or returning
worker only as the running ranks enter the rendezvous, and its Python and torch take longer than the short collective
timeout above to start on a busy or cold node; under that timeout alone the running ranks aborted and the job
failed."""
BLACKLIST_COOLDOWN_SECONDS = (2, 30)
"""A host whose worker failed may rejoin after 4-6 s, doubling on each further failure (horovodrun's range)."""


def new_run_id(now: float | None = None) -> str:
    """A run's name where no cluster ID gives one (compose, an MPIJob): its UTC start time and a random part."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + "-" + secrets.token_hex(2)


def trainer_with(command: list[str] | tuple[str, ...], flag: str, *value: str) -> list[str]:
    """`command` with `flag` (and its value) added when it runs the bundled trainer without that flag already
    (as `--flag V` or `--flag=V`); a command of the user's is theirs and stays as it is."""
    command = list(command)
    if command[: len(TRAINER)] != list(TRAINER) or any(word.split("=")[0] == flag for word in command):
        return command
    return [*command, flag, *value]


def with_run_dir(command: list[str] | tuple[str, ...], folder: str) -> list[str]:
    """The bundled trainer writes each run into a folder of its own (metrics, checkpoints, TensorBoard, curves),
    so a second run never overwrites the first's."""
    return trainer_with(command, "--run-dir", folder)


@dataclass(frozen=True)
class RunPaths:
    """Where a job's run goes, as the job spec carries it: laid out once from the user's options and the job's run
    folder (run_paths), and never read back out of the command line built from them."""

    trainer: bool = False
    """The job runs the bundled trainer (whose options say where its run goes), not a command of the user's."""
    run_dir: str | None = None
    """The bundled trainer's run folder (the user's --run-dir, else the job's run folder), which the agent makes and
    links as runs/latest; None for a user's command (it decides where it writes)."""
    metrics_file: str | None = None
    """The bundled trainer's metrics (its --metrics-file, else the run folder's), which the agent's stall watch and a
    restart read; None for a user's command."""
    checkpoint_dir: str | None = None
    """Where a job that may be restarted keeps its checkpoints (CHECKPOINT_DIR_VARIABLE): the bundled trainer's own
    (--checkpoint-dir, else the run folder's), else `checkpoints` in the job's run folder; None for a job without
    restarts, or without a folder."""


def run_paths(command: tuple[str, ...], run_folder: str | None, restartable: bool) -> RunPaths:
    """The job's RunPaths from the options' `command` (the bundled trainer's options, by the trainer's own parser and
    layout: app/config.py) and its run folder."""
    if command[: len(TRAINER)] != TRAINER:
        return RunPaths(checkpoint_dir=f"{run_folder}/checkpoints" if restartable and run_folder else None)
    words = with_run_dir(command, run_folder)[len(TRAINER) :] if run_folder else command[len(TRAINER) :]
    laid_out = {key: str(path) if path else None for key, path in laid_out_paths(words).items()}
    checkpoints = laid_out["checkpoint_dir"] if restartable else None
    return RunPaths(True, laid_out["run_dir"], laid_out["metrics_file"], checkpoints)


def command_probe(command: list[str] | tuple[str, ...]) -> list[str]:
    """A bash argv that fails, printing why, when a rank could not start the command: its program is not on PATH,
    or a script given to python is not there (relative to the working directory)."""
    checks = 'command -v "$1" >/dev/null || { echo "$1 is not on PATH"; exit 1; }'
    argv = [command[0]]
    if Path(command[0]).name.startswith("python") and len(command) > 1 and not command[1].startswith("-"):
        checks += '; [ -f "$2" ] || { echo "script $2 is not there"; exit 1; }'
        argv.append(command[1])
    return ["bash", "-c", checks, "probe", *argv]


def mpirun_argv(
    *,
    ranks: int,
    hostfile: str,
    command: list[str] | tuple[str, ...],
    network_interface: str | None = None,
    excluded_subnets: tuple[str, ...] = (),
    across_hosts: bool = False,
    env: tuple[str, ...] = (),
    secrets: tuple[str, ...] = (),
    workdir: str | None = None,
) -> list[str]:
    """The one mpirun command line of a job: the seed article's flags, each rank's lines tagged with its rank
    (TAG_OUTPUT), NIC selection for Open MPI, NCCL and Gloo (nic_selection), Open MPI's listening ports
    (port_selection), the user's variables (-x), the secret ones by name alone (mpirun hands their values from its
    own environment to every rank), the stack's Horovod defaults the user did not set, the working directory, then
    the command every rank runs."""
    argv = [
        "mpirun",
        "-np",
        str(ranks),
        "--hostfile",
        hostfile,
        "-bind-to",
        "none",
        "-map-by",
        "slot",
        TAG_OUTPUT,  # every line a rank writes names its rank, for `launcher logs --rank` and `start --ranks`
        # Only the launching container holds the cluster's private key, so it starts every remote daemon.
        "--mca",
        "plm_rsh_no_tree_spawn",
        "1",
        "-x",
        "PATH",
        "-x",
        "PYTHONPATH",
    ]
    user_set = names_in(env)
    argv += nic_selection(network_interface, excluded_subnets, across_hosts, user_set)
    argv += port_selection()  # Open MPI listens on every address: its ports are held to one range a firewall names
    for item in (*env, *secrets):
        argv += ["-x", item]
    for item in defaults_unless_set(env):
        argv += ["-x", item]
    if workdir:
        argv += ["-wdir", workdir]
    return argv + rank_command(command, network_interface, user_set)


def horovod_outputs(timeline: bool, autotune: bool, folder: str | None, user_set: frozenset[str]) -> list[str]:
    """KEY=VALUE for Horovod's own records of a run, written into its run `folder`: rank 0's timeline
    (HOROVOD_TIMELINE) and the autotuner's log (HOROVOD_AUTOTUNE, HOROVOD_AUTOTUNE_LOG); a variable the user's --env
    sets (`user_set`) stays theirs. Nothing without a folder."""
    if not folder:
        return []
    wanted = {}
    if timeline:
        wanted["HOROVOD_TIMELINE"] = f"{folder}/{TIMELINE_FILE}"
    if autotune:
        wanted.update(HOROVOD_AUTOTUNE="1", HOROVOD_AUTOTUNE_LOG=f"{folder}/{AUTOTUNE_LOG}")
    return [f"{name}={value}" for name, value in wanted.items() if name not in user_set]


def defaults_unless_set(env: tuple[str, ...], extra: dict[str, str] | None = None) -> list[str]:
    """KEY=VALUE for each of the stack's defaults (HOROVOD_DEFAULTS, then `extra`) that the user's --env pairs do
    not set themselves."""
    chosen = names_in(env)
    return [f"{name}={value}" for name, value in {**HOROVOD_DEFAULTS, **(extra or {})}.items() if name not in chosen]


def rank_command(
    command: list[str] | tuple[str, ...], network_interface: str | None, user_set: frozenset[str] = frozenset()
) -> list[str]:
    """What each rank runs: the command itself, or, when the job's NIC is a subnet, the command behind RANK_NIC,
    which sets NCCL's and Gloo's NIC to the one its own host has in the subnet (the names may differ between hosts)
    and leaves a variable the user set (`user_set`) as it is."""
    subnet = subnet_of(network_interface)
    if not subnet:
        return list(command)
    keep = sorted(user_set & set(NIC_VARIABLES))
    return [*RANK_NIC, subnet, *(["--keep", ",".join(keep)] if keep else []), "--", *command]


def horovodrun_argv(
    *,
    min_ranks: int,
    max_ranks: int,
    slots_per_host: int,
    network_interface: str,
    ssh_port: int,
    elastic_timeout: int,
    command: list[str] | tuple[str, ...],
    env: tuple[str, ...] = (),
    workdir: str | None = None,
    driver_nic: str | None = None,
    discovery_script: str = DISCOVERY_SCRIPT,
) -> list[str]:
    """The one horovodrun command line of an elastic job (Gloo; its NIC pinned, as JobOptions requires): it starts
    max_ranks ranks on the hosts that DISCOVERY_SCRIPT lists, carries on while at least min_ranks remain, takes
    returning hosts back, and gives up after elastic_timeout seconds below the minimum. horovodrun hands its own
    environment to every rank and runs them in its own working directory, hence `env -C WORKDIR VARIABLES...` in front.
    The discovery script reads the job's workers from the job spec (launcher.agent discover). With a subnet for a NIC,
    horovodrun is given its own host's NIC in it (`driver_nic`: it serves the ranks' rendezvous there) and each rank
    finds its own (rank_command)."""
    # Rank 0's NIC in the subnet is a fact its node's check finds (a start refuses a node without an address in the
    # subnet); before that fact is known, as in a dry run of a node without the image, the line says what goes there.
    rank0_nic = (
        (driver_nic or f"<rank 0's NIC in {network_interface}>") if subnet_of(network_interface) else network_interface
    )
    command = trainer_with(command, "--elastic")  # the bundled trainer's loop; a user's script brings its own
    defaults = defaults_unless_set(
        env,
        {
            "HOROVOD_GLOO_TIMEOUT_SECONDS": str(ELASTIC_GLOO_TIMEOUT_SECONDS),
            "HOROVOD_STACK_RENDEZVOUS_TIMEOUT_SECONDS": str(ELASTIC_RENDEZVOUS_TIMEOUT_SECONDS),
        },
    )
    user_set = names_in(env)
    variables = [*nic_variables(rank0_nic), *defaults, *env]
    return [
        "env",
        *(["-C", workdir] if workdir else []),
        *variables,
        "horovodrun",
        "--gloo",
        "-np",
        str(max_ranks),
        "--min-np",
        str(min_ranks),
        "--max-np",
        str(max_ranks),
        "--slots-per-host",
        str(slots_per_host),
        "--host-discovery-script",
        discovery_script,
        "--network-interface",
        rank0_nic,
        "--ssh-port",
        str(ssh_port),
        "--elastic-timeout",
        str(elastic_timeout),
        "--blacklist-cooldown-range",
        *map(str, BLACKLIST_COOLDOWN_SECONDS),
        *rank_command(command, network_interface, user_set),
    ]


def hostfile(workers: list[Worker] | tuple[Worker, ...], slots: int) -> str:
    """Open MPI's hostfile: one line per worker, by the address mpirun and ssh use, with its own rank count (or
    `slots`, the job's, for a worker without one)."""
    return "".join(f"{worker.address} slots={worker.slots or slots}\n" for worker in workers)


def pin_known_host(known_hosts: str, address: str, port: int, host_key: str) -> str:
    """known_hosts with `host_key` ('TYPE BASE64') pinned for [address]:port: a worker that came back at the same
    address with a new key replaces its old line; every other line stays."""
    pattern = f"[{address}]:{port} "
    kept = [line for line in known_hosts.splitlines() if line and not line.startswith(pattern)]
    return "".join(f"{line}\n" for line in [*kept, pattern + " ".join(host_key.split()[:2])])


def ssh_config(port: int) -> str:
    """The rank-0 side's ssh client settings for every connection into the cluster (the agent's, mpirun's and
    horovodrun's): the cluster's key, the pinned host keys, and a peer that answers nothing for SILENCE_SECONDS
    given up on (without it, a session to a silent node waits forever and the job hangs with it)."""
    return (
        f"Host *\n  Port {port}\n  IdentityFile {CLUSTER_KEY}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {KNOWN_HOSTS}\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
        f"  ConnectTimeout {SSH_CONNECT_TIMEOUT_SECONDS}\n  ServerAliveInterval {KEEPALIVE_INTERVAL_SECONDS}\n"
        f"  ServerAliveCountMax {KEEPALIVE_COUNT}\n  LogLevel ERROR\n"
    )


@dataclass(frozen=True)
class Worker:
    name: str
    """How logs and errors name it: the node's name (launcher) or its address (compose)."""
    address: str
    """What ssh and mpirun connect to."""
    slots: int | None = None
    """Its ranks (a node's count from --nodes HOST:SLOTS or --hostfile); None: the job's slots."""


@dataclass(frozen=True)
class LaunchMethodFixes:
    """How one launch method words the fixes in the agent's errors (its users set different knobs)."""

    command_fix: str = (
        "pass --workdir with the folder that holds your code, or build an image FROM horovod-stack:latest that has it"
    )
    workers_fix: str = "check that rank 0 reaches those hosts by name and that the port is open between nodes"
    lost_hint: str = "`launcher status` shows how each worker ended"
    unreached_hint: str = f"a worker no job claims stops by itself {WORKER_CLAIM_TIMEOUT_SECONDS} s after it started"
    """What becomes of a worker the agent could not tell that the job ended."""


@dataclass(frozen=True)
class JobSpec:
    """One job, as the job agent runs it: what the user asked for (options), where its workers are, and how it ends.

    Launch methods differ only in how workers are found: a fixed list (the multi-host launcher's nodes, rank 0's first;
    the MPI Operator's hostfile) or a DNS name that resolves to every worker (compose's service) with the number to wait
    for."""

    job_id: str
    options: JobOptions
    expected_workers: int
    run_folder: str | None = None
    """Where the bundled trainer writes this run (a folder of its own under RUNS_DIR, so a second run never
    overwrites the first's), unless the user's options give it another; a user's command decides for itself."""
    slots: int = 1
    workers: tuple[Worker, ...] = ()
    worker_service: str | None = None
    excluded_subnets: tuple[str, ...] = ()
    """With no NIC pinned: the subnets of the workers' hosts' virtual NICs, which Open MPI leaves out
    (nic_selection)."""
    across_hosts: bool = False
    """The workers are on more than one host: an unpinned NIC is not left to chance."""
    driver_nic: str | None = None
    """With a subnet for the NIC: rank 0's host's NIC in it (elastic horovodrun serves there)."""
    discovery_script: str = DISCOVERY_SCRIPT
    """Elastic: the host discovery horovodrun runs (the agent's own, or the MPI Operator's in an MPIJob)."""
    gpus: bool = False
    """The workers were given GPUs: every rank is told so (GPUS_ASKED) and refuses to train on the CPU."""
    driver: str = "the job's agent"
    """How a worker names this job's driver when it is lost ("rank 0 on node_1", "compose's launcher container")."""
    keep_running: bool = False
    """The workers stay up after the job (--keep-running) until `launcher stop`."""
    agent_host: str | None = None
    """The address of the worker whose container runs the agent (the launcher's rank 0), told last when the job
    ends; None where the agent has a container of its own (compose)."""
    make_key: bool = False
    """The agent makes the cluster's key pair (compose, where nobody outside the cluster hands one over)."""
    results_hint: str | None = None
    words: LaunchMethodFixes = field(default_factory=LaunchMethodFixes)
    spares: tuple[Worker, ...] = ()
    """Workers kept in reserve (--spares): started and checked with the others, out of the hostfile until a restart
    puts one in a lost worker's place."""
    restart: int = 0
    """Which run of the job this is (--max-restarts): 0 its first, N its Nth restart, which resumes from the newest
    checkpoint (the bundled trainer is given --resume)."""
    paths: RunPaths = field(init=False, default_factory=RunPaths)
    """Where the run goes (run_paths), laid out once from the options and the run folder."""

    def __post_init__(self) -> None:
        options = self.options
        problem = options.workers_problem(self.expected_workers) if self.expected_workers else None
        if problem:
            raise SettingsError(problem)
        object.__setattr__(self, "paths", run_paths(options.command, self.run_folder, options.can_restart))

    @property
    def elastic(self) -> bool:
        return self.options.elastic

    @property
    def program(self) -> str:
        return "horovodrun" if self.elastic else "mpirun"

    @property
    def command(self) -> tuple[str, ...]:
        """What every rank runs: the options' command, the bundled trainer given its run folder (and on a restart,
        --resume where it keeps checkpoints)."""
        command = self.options.command
        command = tuple(with_run_dir(command, self.run_folder)) if self.run_folder else command
        if self.restart and self.paths.trainer and self.paths.checkpoint_dir:
            return tuple(trainer_with(command, "--resume"))
        return command

    @property
    def run_dir(self) -> str | None:
        return self.paths.run_dir

    @property
    def metrics_file(self) -> str | None:
        return self.paths.metrics_file

    @property
    def checkpoint_dir(self) -> str | None:
        return self.paths.checkpoint_dir

    @property
    def output_dir(self) -> str | None:
        """The run folder the agent makes: the bundled trainer's, or, for a user's command with --timeline or
        --autotune, the job's run folder for Horovod's records alone."""
        options = self.options
        return self.run_dir or (
            self.run_folder if options.timeline or options.autotune or options.can_restart else None
        )

    @property
    def cwd(self) -> str:
        return WORKDIR if self.options.workdir else HOME

    @property
    def rank_env(self) -> tuple[str, ...]:
        """KEY=VALUE pairs every rank gets: the user's, Horovod's timeline and autotuning where asked for
        (horovod_outputs), where the workers were given GPUs, GPUS_ASKED and the frameworks' GPU settings the
        user's leave unset (app/gpu.py gpu_rank_env), and the switch that has a rank write its error's record when it
        dies of one (app/rank_error.py, read by the agent)."""
        options = self.options
        user_set = names_in(options.env)
        outputs = horovod_outputs(options.timeline, options.autotune, self.output_dir, user_set)
        gpus = gpu_rank_env(user_set) if self.gpus else ()
        return (*options.env, *outputs, *gpus, *self.restart_env, f"{rank_error.VARIABLE}=1")

    @property
    def restart_env(self) -> tuple[str, ...]:
        """For a job that may be restarted: which run this is, and where its checkpoints are (unless the user's
        --env sets them)."""
        if not self.options.can_restart:
            return ()
        wanted = {RESTART_VARIABLE: str(self.restart), CHECKPOINT_DIR_VARIABLE: self.checkpoint_dir}
        user_set = names_in(self.options.env)
        return tuple(f"{name}={value}" for name, value in wanted.items() if value is not None and name not in user_set)

    def slots_of(self, worker: Worker) -> int:
        return worker.slots or self.slots

    def rank_counts(self) -> list[int]:
        """Each expected worker's ranks: the listed workers' own counts, or the job's slots for each."""
        return [self.slots_of(worker) for worker in self.workers] or [self.slots] * self.expected_workers

    def job_argv(self) -> list[str]:
        """The job's one command line: mpirun over HOSTFILE_PATH, or elastic horovodrun over the discovery."""
        options = self.options
        workdir = WORKDIR if options.workdir else None
        if not self.elastic:
            return mpirun_argv(
                ranks=sum(self.rank_counts()),
                hostfile=HOSTFILE_PATH,
                command=self.command,
                network_interface=options.network_interface,
                excluded_subnets=self.excluded_subnets,
                across_hosts=self.across_hosts,
                env=self.rank_env,
                secrets=options.secrets,
                workdir=workdir,
            )
        assert options.network_interface  # JobOptions: an elastic job has its NIC
        # Counts that differ between hosts: the minimum holds whichever hosts remain, the maximum whichever join.
        counts = sorted(self.rank_counts())
        return horovodrun_argv(
            min_ranks=sum(counts[: options.min_workers]),
            max_ranks=sum(counts[::-1][: options.elastic_max_workers or self.expected_workers]),
            slots_per_host=self.slots,
            network_interface=options.network_interface,
            ssh_port=options.ssh_port,
            elastic_timeout=options.elastic_timeout,
            command=self.command,
            env=self.rank_env,
            workdir=workdir,
            driver_nic=self.driver_nic,
            discovery_script=self.discovery_script,
        )

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "options": self.options.to_dict()}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        data = json.loads(text)
        known = {name for name, item in cls.__dataclass_fields__.items() if item.init}
        data = {key: value for key, value in data.items() if key in known}  # a newer launcher's extras
        return cls(
            **{
                **data,
                "options": JobOptions.from_dict(data["options"]),
                "excluded_subnets": tuple(data.get("excluded_subnets", ())),
                "workers": tuple(Worker(**worker) for worker in data.get("workers", ())),
                "spares": tuple(Worker(**worker) for worker in data.get("spares", ())),
                "words": LaunchMethodFixes(**data.get("words", {})),
            }
        )
