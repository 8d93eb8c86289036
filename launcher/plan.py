"""The launch plan: from nodes, slots and settings to container specs, the job spec, the hostfile and the argv.

Pure functions of their inputs, with no Docker or network access, so every line mpirun will see is unit-tested.
A job is one JobSpec, whichever door made it (the multi-host launcher through ClusterPlan.job_spec, compose through
launcher.compose_job): the job agent in the rank-0 container (launcher/agent.py) runs it, and its command line
(mpirun, or horovodrun for elastic training) is built here.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import PurePosixPath as Path

from app.gpu import GPUS_ASKED
from app.horovod_defaults import HOROVOD_DEFAULTS
from launcher.protocol import (
    CLUSTER_KEY,
    DISCOVERY_SCRIPT,
    ELASTIC_TIMEOUT_SECONDS,
    HOME,
    HOSTFILE_PATH,
    KNOWN_HOSTS,
    READY_TIMEOUT_SECONDS,
    SSH_CONNECT_TIMEOUT_SECONDS,
    SSH_PORT,
)

LABEL_CLUSTER = "horovod-stack.cluster"
LABEL_NODE = "horovod-stack.node"
LABEL_ROLE = "horovod-stack.role"
SHARED_MOUNT = "/shared"
RUNS_DIR = f"{SHARED_MOUNT}/runs"
"""Each cluster's trainer run writes into RUNS_DIR/<cluster id> (run_dir): metrics, checkpoints, TensorBoard."""
NIC_SETTING = "NODE_NETWORK_INTERFACE"
"""The launcher's .env key for the NIC; compose's NETWORK_INTERFACE names a NIC of its containers, not the nodes'."""
WORKDIR = "/workdir"
"""Where the user's code sits in every container (--workdir, compose's WORKDIR); the job's working directory."""
TRAINER = ("python", "-m", "app.train")
ELASTIC_GLOO_TIMEOUT_SECONDS = 10
"""How long a rank waits on a silent peer before its collective fails (Horovod's default: 30 s). A killed worker's
peers often get no TCP reset, so this bounds how soon an elastic job notices the loss; --env
HOROVOD_GLOO_TIMEOUT_SECONDS=N overrides it for steps where ranks legitimately wait longer."""
BLACKLIST_COOLDOWN_SECONDS = (2, 30)
"""A host whose worker failed may rejoin after 4-6 s, doubling on each further failure (horovodrun's range)."""
WORKER_ULIMITS = {"stack": 64 * 1024**2}
"""NCCL's container advice, for every worker: a 64 MB stack (compose.yaml sets the same)."""
GPU_WORKER_ULIMITS = {**WORKER_ULIMITS, "memlock": -1}
"""GPU workers also get unlimited locked memory, which NCCL's RDMA transports register their buffers in
(compose.gpu.yaml sets the same). Not for CPU workers: raising the limit needs the engine's CAP_SYS_RESOURCE,
which some hosts (sandboxes, rootless engines) lack, and CPU jobs have no use for it."""
WORKER_CAPABILITIES = ("IPC_LOCK",)
"""Lets a rank lock the memory it registers for RDMA (InfiniBand, RoCE)."""
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Open MPI 4 refuses host names outside RFC 952 (an underscore, as in node_1, stops mpirun).
OPEN_MPI_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*$")


def mpi_host(name: str, address: str | None) -> str:
    """The name mpirun and ssh use for a node: its own name where Open MPI accepts it, else its address."""
    if OPEN_MPI_HOST_NAME.match(name):
        return name
    if not address:
        raise ValueError(f"{name} needs an address: Open MPI does not accept it as a host name")
    return address


def job_command(args: tuple[str, ...] | list[str]) -> list[str]:
    """What every rank runs, from the words after `--`: a command of the user's when the first word is not an
    option (as with mpirun and horovodrun), else the bundled trainer with those options."""
    args = list(args)
    if args[:1] == ["--"]:
        args = args[1:]
    if args and not args[0].startswith("-"):
        return args
    return [*TRAINER, *args]


def run_dir(cluster_id: str) -> str:
    """The bundled trainer's --run-dir for a cluster, in the shared mount."""
    return f"{RUNS_DIR}/{cluster_id}"


def trainer_with(command: list[str] | tuple[str, ...], flag: str, *value: str) -> list[str]:
    """`command` with `flag` (and its value) added when it runs the bundled trainer without that flag already
    (as `--flag V` or `--flag=V`); a command of the user's is theirs and stays as it is."""
    command = list(command)
    if command[: len(TRAINER)] != list(TRAINER) or any(word.split("=")[0] == flag for word in command):
        return command
    return [*command, flag, *value]


def trainer_option(command: list[str] | tuple[str, ...], flag: str) -> str | None:
    """The value the bundled trainer's `command` gives `flag` (`--flag V` or `--flag=V`); None if it gives none or
    the command is not the bundled trainer."""
    words = list(command)
    if words[: len(TRAINER)] != list(TRAINER):
        return None
    for index, word in enumerate(words):
        if word == flag and index + 1 < len(words):
            return words[index + 1]
        if word.startswith(f"{flag}="):
            return word.split("=", 1)[1]
    return None


def with_run_dir(command: list[str] | tuple[str, ...], folder: str) -> list[str]:
    """The bundled trainer writes each run into a folder of its own (metrics, checkpoints, TensorBoard, curves),
    so a second run never overwrites the first's."""
    return trainer_with(command, "--run-dir", folder)


def nic_problem(wanted: str | None, nics: list[str] | tuple[str, ...]) -> str | None:
    """Why a node cannot use the NIC `wanted`, given the NICs it has; None if it can, or if none is asked for.
    Gloo and Horovod take one exact name (no prefix or subnet, as NCCL and Open MPI would), so it must match."""
    if not wanted or wanted in nics:
        return None
    return (
        f"no network interface {wanted} there (it has {', '.join(sorted(nics)) or 'none'}); pass "
        f"--network-interface with one of them, or set {NIC_SETTING} in .env"
    )


def check_env_assignment(item: str) -> str:
    """KEY=VALUE for mpirun's -x; raises ValueError naming the fix."""
    key, separator, _ = item.partition("=")
    if not separator or not ENV_NAME.match(key):
        raise ValueError(f"--env {item!r} is not KEY=VALUE with a variable name as KEY")
    return item


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
    env: tuple[str, ...] = (),
    workdir: str | None = None,
) -> list[str]:
    """The one mpirun command line of a job: the seed article's flags, NIC selection for Open MPI, NCCL and
    Gloo, the user's variables (-x), the stack's Horovod defaults the user did not set, the working directory,
    then the command every rank runs."""
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
        # Only the launching container holds the cluster's private key, so it starts every remote daemon.
        "--mca",
        "plm_rsh_no_tree_spawn",
        "1",
        "-x",
        "PATH",
        "-x",
        "PYTHONPATH",
    ]
    if network_interface:
        argv += ["--mca", "btl_tcp_if_include", network_interface, "--mca", "oob_tcp_if_include", network_interface]
        for variable in nic_variables(network_interface):
            argv += ["-x", variable]
    for item in env:
        argv += ["-x", check_env_assignment(item)]
    for item in defaults_unless_set(env):
        argv += ["-x", item]
    if workdir:
        argv += ["-wdir", workdir]
    return argv + list(command)


def defaults_unless_set(env: tuple[str, ...], extra: dict[str, str] | None = None) -> list[str]:
    """KEY=VALUE for each of the stack's defaults (HOROVOD_DEFAULTS, then `extra`) that the user's --env pairs do
    not set themselves."""
    chosen = {check_env_assignment(item).partition("=")[0] for item in env}
    return [f"{name}={value}" for name, value in {**HOROVOD_DEFAULTS, **(extra or {})}.items() if name not in chosen]


def nic_variables(network_interface: str | None) -> list[str]:
    """The variables that pin NCCL's and Gloo's traffic to one NIC (Open MPI's own flags are separate). NCCL takes
    a bare name as a prefix (eth0 would also match eth01); a leading `=` makes it exact, as Gloo's are."""
    nic = network_interface
    return [f"NCCL_SOCKET_IFNAME=={nic}", f"GLOO_SOCKET_IFNAME={nic}", f"HOROVOD_GLOO_IFACE={nic}"] if nic else []


def horovodrun_argv(
    *,
    min_ranks: int,
    max_ranks: int,
    slots_per_host: int,
    network_interface: str | None,
    ssh_port: int,
    elastic_timeout: int,
    command: list[str] | tuple[str, ...],
    env: tuple[str, ...] = (),
    workdir: str | None = None,
) -> list[str]:
    """The one horovodrun command line of an elastic job (Gloo): it starts max_ranks ranks on the hosts that
    DISCOVERY_SCRIPT lists, carries on while at least min_ranks remain, takes returning hosts back, and gives up
    after elastic_timeout seconds below the minimum. horovodrun hands its own environment to every rank and runs
    them in its own working directory, hence `env -C WORKDIR VARIABLES...` in front. The discovery script reads
    the job's workers from the job spec (launcher.agent discover)."""
    if not network_interface:
        # Without it horovodrun probes every host pair for common NICs and, with all slots on one host, waits for
        # that probe until it times out.
        raise ValueError(
            "elastic training needs the NIC the nodes reach each other on: pass --network-interface "
            "(e.g. eth0; `ip -br addr` on a node lists them)"
        )
    command = trainer_with(command, "--elastic")  # the bundled trainer's loop; a user's script brings its own
    defaults = defaults_unless_set(env, {"HOROVOD_GLOO_TIMEOUT_SECONDS": str(ELASTIC_GLOO_TIMEOUT_SECONDS)})
    variables = [
        *nic_variables(network_interface),
        *defaults,
        *(check_env_assignment(item) for item in env),
    ]
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
        DISCOVERY_SCRIPT,
        "--network-interface",
        network_interface,
        "--ssh-port",
        str(ssh_port),
        "--elastic-timeout",
        str(elastic_timeout),
        "--blacklist-cooldown-range",
        *map(str, BLACKLIST_COOLDOWN_SECONDS),
        *command,
    ]


def hostfile(workers: list[Worker] | tuple[Worker, ...], slots: int) -> str:
    """Open MPI's hostfile: one line per worker, by the address mpirun and ssh use."""
    return "".join(f"{worker.address} slots={slots}\n" for worker in workers)


def pin_known_host(known_hosts: str, address: str, port: int, host_key: str) -> str:
    """known_hosts with `host_key` ('TYPE BASE64') pinned for [address]:port: a worker that came back at the same
    address with a new key replaces its old line; every other line stays."""
    pattern = f"[{address}]:{port} "
    kept = [line for line in known_hosts.splitlines() if line and not line.startswith(pattern)]
    return "".join(f"{line}\n" for line in [*kept, pattern + " ".join(host_key.split()[:2])])


def ssh_config(port: int) -> str:
    """The rank-0 side's ssh client settings for every connection into the cluster (the agent's and mpirun's)."""
    return (
        f"Host *\n  Port {port}\n  IdentityFile {CLUSTER_KEY}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {KNOWN_HOSTS}\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
        f"  ConnectTimeout {SSH_CONNECT_TIMEOUT_SECONDS}\n  LogLevel ERROR\n"
    )


@dataclass(frozen=True)
class Worker:
    name: str
    """How logs and errors name it: the node's name (launcher) or its address (compose)."""
    address: str
    """What ssh and mpirun connect to."""


@dataclass(frozen=True)
class DoorWords:
    """How one door words the fixes in the agent's errors (its users set different knobs)."""

    command_fix: str = (
        "pass --workdir with the folder that holds your code, or build an image FROM horovod-stack:latest that has it"
    )
    workers_fix: str = "check that rank 0 reaches those hosts by name and that the port is open between nodes"
    elastic_minimum: str = "--min-nodes"
    """The setting that holds the elastic minimum, as the user wrote it."""
    lost_hint: str = "`launcher status` shows how each worker ended"


@dataclass(frozen=True)
class JobSpec:
    """One job, as the job agent runs it: where its workers are, what every rank runs, and how it ends.

    Doors differ only in how workers are found: a fixed list (the multi-host launcher's nodes, rank 0's first) or
    a DNS name that resolves to every worker (compose's service) with the number to wait for."""

    job_id: str
    command: tuple[str, ...]
    expected_workers: int
    slots: int = 1
    workers: tuple[Worker, ...] = ()
    worker_service: str | None = None
    ssh_port: int = SSH_PORT
    network_interface: str | None = None
    env: tuple[str, ...] = ()
    """KEY=VALUE pairs every rank gets."""
    workdir: str | None = None
    """The job's working directory in every container (WORKDIR), when the user's code is there."""
    elastic_min_workers: int | None = None
    elastic_max_workers: int | None = None
    elastic_timeout: int = ELASTIC_TIMEOUT_SECONDS
    ready_timeout: float = READY_TIMEOUT_SECONDS
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
    words: DoorWords = field(default_factory=DoorWords)

    @property
    def elastic(self) -> bool:
        return self.elastic_min_workers is not None

    @property
    def program(self) -> str:
        return "horovodrun" if self.elastic else "mpirun"

    @property
    def run_dir(self) -> str | None:
        """The bundled trainer's run folder, which the agent makes and links as runs/latest; None for a user's
        command (it decides where it writes)."""
        return trainer_option(self.command, "--run-dir")

    @property
    def cwd(self) -> str:
        return self.workdir or HOME

    def job_argv(self) -> list[str]:
        """The job's one command line: mpirun over HOSTFILE_PATH, or elastic horovodrun over the discovery."""
        if not self.elastic:
            return mpirun_argv(
                ranks=self.expected_workers * self.slots,
                hostfile=HOSTFILE_PATH,
                command=self.command,
                network_interface=self.network_interface,
                env=self.env,
                workdir=self.workdir,
            )
        assert self.elastic_min_workers is not None
        return horovodrun_argv(
            min_ranks=self.elastic_min_workers * self.slots,
            max_ranks=(self.elastic_max_workers or self.expected_workers) * self.slots,
            slots_per_host=self.slots,
            network_interface=self.network_interface,
            ssh_port=self.ssh_port,
            elastic_timeout=self.elastic_timeout,
            command=self.command,
            env=self.env,
            workdir=self.workdir,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        known = {item.name for item in fields(cls)}
        data = {key: value for key, value in json.loads(text).items() if key in known}  # a newer launcher's extras
        tuples = {key: tuple(data[key]) for key in ("command", "env")}
        workers = tuple(Worker(**worker) for worker in data["workers"])
        return cls(**{**data, **tuples, "workers": workers, "words": DoorWords(**data["words"])})


@dataclass(frozen=True)
class Node:
    name: str
    """The name mpirun and ssh use for this host; it must resolve to the host on every node."""
    engine_url: str
    """How the launcher reaches the node's Docker engine: ssh://NAME by default, or an override."""


@dataclass(frozen=True)
class ClusterPlan:
    cluster_id: str
    nodes: tuple[Node, ...]
    image: str
    slots_per_node: int
    gpus_per_node: int
    ssh_port: int
    network_interface: str | None
    shared_dir: str
    """Volume name or host folder mounted at /shared on every node (datasets, checkpoints, metrics)."""
    shm_size: str
    command: tuple[str, ...]
    """What every rank runs (job_command): the user's command, or the trainer with its options."""
    env: tuple[str, ...] = ()
    """KEY=VALUE pairs every rank gets (mpirun -x)."""
    devices: tuple[str, ...] = ()
    """Host devices every worker gets, HOST_PATH[:CONTAINER_PATH] (RDMA: /dev/infiniband)."""
    workdir: str | None = None
    """A local folder copied to WORKDIR in every container, the job's working directory; None: none."""
    addresses: tuple[tuple[str, str], ...] = ()
    """(node name, IPv4 address) as rank 0 resolves them; used for names Open MPI refuses."""
    elastic_min_nodes: int | None = None
    """Elastic training (horovodrun, Gloo) when set: the job goes on while this many nodes' workers remain."""
    elastic_max_nodes: int | None = None
    """Elastic: the most nodes training at once (default: all of them)."""
    elastic_timeout: int = ELASTIC_TIMEOUT_SECONDS
    """Elastic: seconds the job waits below the minimum for nodes to come back before it fails."""
    ready_timeout: float = READY_TIMEOUT_SECONDS
    """How long the job agent waits for every worker's sshd to answer."""

    @property
    def rank0(self) -> Node:
        return self.nodes[0]

    @property
    def total_ranks(self) -> int:
        return self.slots_per_node * len(self.nodes)

    def container_name(self, node: Node) -> str:
        return f"horovod-stack-{self.cluster_id}-{node.name}"

    def labels(self, node: Node) -> dict[str, str]:
        return {
            LABEL_CLUSTER: self.cluster_id,
            LABEL_NODE: node.name,
            LABEL_ROLE: "rank0" if node == self.rank0 else "worker",
        }

    def worker_environment(self, node: Node) -> dict[str, str]:
        # No secret here: keys reach the container as files through the API after it starts.
        environment = {"SSH_PORT": str(self.ssh_port), "WORKER_ADDRESS": node.name}
        if node == self.rank0:
            environment["EXIT_WITH_JOB"] = "1"  # rank 0's container stops with the job's exit status
        return environment

    def mpi_host(self, node: Node) -> str:
        return mpi_host(node.name, dict(self.addresses).get(node.name))

    def needs_addresses(self) -> list[Node]:
        return [node for node in self.nodes if not OPEN_MPI_HOST_NAME.match(node.name)]

    def workers(self) -> tuple[Worker, ...]:
        return tuple(Worker(node.name, self.mpi_host(node)) for node in self.nodes)

    @property
    def elastic(self) -> bool:
        return self.elastic_min_nodes is not None

    def job_spec(self, keep_running: bool = False) -> JobSpec:
        """The job the agent in rank 0's container runs. (Before the addresses are resolved, as when the plan is
        first logged, a name Open MPI would refuse stands for itself.)"""
        resolved = dict(self.addresses)
        workers = tuple(
            Worker(node.name, mpi_host(node.name, resolved.get(node.name, node.name))) for node in self.nodes
        )
        return JobSpec(
            job_id=self.cluster_id,
            command=self.command,
            expected_workers=len(self.nodes),
            slots=self.slots_per_node,
            workers=workers,
            ssh_port=self.ssh_port,
            network_interface=self.network_interface,
            workdir=WORKDIR if self.workdir else None,
            elastic_min_workers=self.elastic_min_nodes,
            elastic_max_workers=self.elastic_max_nodes,
            elastic_timeout=self.elastic_timeout,
            ready_timeout=self.ready_timeout,
            env=(*self.env, f"{GPUS_ASKED}=1") if self.gpus_per_node else self.env,
            driver=f"rank 0's container on {self.rank0.name}",
            agent_host=workers[0].address,
            keep_running=keep_running,
            results_hint=f"the shared folder {self.shared_dir} on {self.rank0.name}",
            words=DoorWords(elastic_minimum=f"--min-nodes {self.elastic_min_nodes}"),
        )

    def job_argv(self) -> list[str]:
        """What the agent in rank 0's container runs: mpirun, or horovodrun for an elastic job."""
        return self.job_spec().job_argv()

    def describe(self) -> str:
        """The effective plan in a few lines, logged once at start."""
        nodes = ", ".join(f"{node.name} ({node.engine_url})" for node in self.nodes)
        code = f", code {self.workdir} -> {WORKDIR}" if self.workdir else ""
        elastic = (
            f", elastic: at least {self.elastic_min_nodes} of {self.elastic_max_nodes or len(self.nodes)} "
            f"nodes (waits {self.elastic_timeout} s below that)"
            if self.elastic
            else ""
        )
        spec = self.job_spec()
        return (
            f"cluster {self.cluster_id}: {self.total_ranks} ranks on {len(self.nodes)} nodes [{nodes}], "
            f"{self.slots_per_node} slot(s) per node{', GPUs' if self.gpus_per_node else ''}, image "
            f"{self.image}, ssh port {self.ssh_port}, NIC {self.network_interface or 'any'}, shared "
            f"{self.shared_dir}{code}{elastic}\n{spec.program}: {' '.join(spec.job_argv())}"
        )
