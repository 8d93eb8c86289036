"""The launch plan: from nodes, slots and settings to container specs, the job spec, the hostfile and the argv.

Pure functions of their inputs, with no Docker or network access, so every line mpirun will see is unit-tested.
A job is one JobSpec, whichever door made it (the multi-host launcher through ClusterPlan.job_spec, compose through
launcher.compose_job): the job agent in the rank-0 container (launcher/agent.py) runs it, and its command line
(mpirun, or horovodrun for elastic training) is built here.
"""

from __future__ import annotations

import ipaddress
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
    RANK_NIC,
    READY_TIMEOUT_SECONDS,
    SSH_CONNECT_TIMEOUT_SECONDS,
    SSH_PORT,
    STALL_TIMEOUT_SECONDS,
)

LABEL_CLUSTER = "horovod-stack.cluster"
LABEL_NODE = "horovod-stack.node"
LABEL_ROLE = "horovod-stack.role"
LABEL_RANKS = "horovod-stack.ranks"
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
WORKER_CAPABILITIES = ("IPC_LOCK", "SYS_PTRACE")
"""IPC_LOCK lets a rank lock the memory it registers for RDMA (InfiniBand, RoCE); SYS_PTRACE lets py-spy read the
ranks' stacks (`launcher stacks`, the stall watch)."""
VIRTUAL_NIC_PREFIXES = ("lo", "docker", "br-", "veth", "virbr")
"""NICs that never carry traffic between hosts: loopback, Docker's bridges (docker0 is 172.17.0.1 on every host, so
a rank that picks it "reaches" its own host) and their veth ends, libvirt's bridges. Across hosts with no NIC
pinned, Open MPI and NCCL are told to leave them out rather than left to pick one and hang."""
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


def subnet_of(network_interface: str | None) -> str | None:
    """The subnet (CIDR) a --network-interface value names, or None where it names a NIC (or nothing)."""
    return network_interface if network_interface and "/" in network_interface else None


def nic_in_subnet(addresses: list[tuple[str, str]] | tuple[tuple[str, str], ...], subnet: str) -> str | None:
    """The NIC that holds an address in `subnet`, among (NIC, address/prefix) pairs; None if none does."""
    network = ipaddress.ip_network(subnet)
    for nic, address in addresses:
        if ipaddress.ip_interface(address).ip in network:
            return nic
    return None


def subnet_problem(subnet: str, addresses: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> str | None:
    """Why a node cannot use `subnet` (no address in it), naming the addresses it has; None if it can."""
    if nic_in_subnet(addresses, subnet):
        return None
    listing = ", ".join(f"{nic} {address}" for nic, address in addresses if not address.startswith("127."))
    return (
        f"no address in {subnet} there (it has {listing or 'none'}); pass --network-interface with a subnet every "
        f"node has an address in, or set {NIC_SETTING} in .env"
    )


def nic_problem(wanted: str | None, nics: list[str] | tuple[str, ...]) -> str | None:
    """Why a node cannot use the NIC `wanted`, given the NICs it has; None if it can, or if none is asked for.
    Gloo and Horovod take one exact name (no prefix or subnet, as NCCL and Open MPI would), so it must match."""
    if not wanted or wanted in nics or subnet_of(wanted):
        return None
    return (
        f"no network interface {wanted} there (it has {', '.join(sorted(nics)) or 'none'}); pass "
        f"--network-interface with one of them, or set {NIC_SETTING} in .env"
    )


def virtual_subnets(addresses: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> list[str]:
    """The IPv4 subnets (CIDR) of the virtual NICs (VIRTUAL_NIC_PREFIXES) among (NIC, address/prefix) pairs, sorted;
    loopback's is Open MPI's default and left out."""
    subnets = {
        str(ipaddress.ip_interface(address).network)
        for nic, address in addresses
        if nic.startswith(VIRTUAL_NIC_PREFIXES) and not ipaddress.ip_interface(address).is_loopback
    }
    return sorted(subnets, key=lambda subnet: ipaddress.ip_network(subnet))


OPEN_MPI_DEFAULT_EXCLUDE = "127.0.0.1/8"


def nic_selection(
    network_interface: str | None,
    excluded_subnets: tuple[str, ...] = (),
    across_hosts: bool = True,
    user_set: frozenset[str] = frozenset(),
) -> list[str]:
    """mpirun's arguments that choose the NICs of a job: the pinned NIC for Open MPI, NCCL and Gloo; or, across
    hosts with none pinned, the virtual NICs left out. Open MPI matches names exactly, and warns on every rank
    about a name its host lacks, so it is told the virtual NICs' subnets (found on each node before the job);
    NCCL takes prefixes after `^`, which also cover NICs that appear later. Gloo takes one name only and runs
    only in elastic jobs, which require a pinned NIC. A variable the user sets (`user_set`) is theirs."""
    if network_interface:
        # Open MPI takes a NIC name or a subnet; for a subnet, each rank finds its own host's NIC in it (RANK_NIC).
        argv = ["--mca", "btl_tcp_if_include", network_interface, "--mca", "oob_tcp_if_include", network_interface]
        if subnet_of(network_interface):
            return argv
        return argv + [word for variable in nic_variables(network_interface) for word in ("-x", variable)]
    if not across_hosts:
        return []
    argv = [] if "NCCL_SOCKET_IFNAME" in user_set else ["-x", f"NCCL_SOCKET_IFNAME=^{','.join(VIRTUAL_NIC_PREFIXES)}"]
    if excluded_subnets:
        # Setting the list replaces Open MPI's default exclusion (loopback), so loopback stays in it.
        subnets = ",".join([OPEN_MPI_DEFAULT_EXCLUDE, *excluded_subnets])
        argv = ["--mca", "btl_tcp_if_exclude", subnets, "--mca", "oob_tcp_if_exclude", subnets, *argv]
    return argv


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
    excluded_subnets: tuple[str, ...] = (),
    across_hosts: bool = False,
    env: tuple[str, ...] = (),
    workdir: str | None = None,
) -> list[str]:
    """The one mpirun command line of a job: the seed article's flags, NIC selection for Open MPI, NCCL and
    Gloo (nic_selection), the user's variables (-x), the stack's Horovod defaults the user did not set, the
    working directory, then the command every rank runs."""
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
    user_set = frozenset(check_env_assignment(item).partition("=")[0] for item in env)
    argv += nic_selection(network_interface, excluded_subnets, across_hosts, user_set)
    for item in env:
        argv += ["-x", check_env_assignment(item)]
    for item in defaults_unless_set(env):
        argv += ["-x", item]
    if workdir:
        argv += ["-wdir", workdir]
    return argv + rank_command(command, network_interface, user_set)


def defaults_unless_set(env: tuple[str, ...], extra: dict[str, str] | None = None) -> list[str]:
    """KEY=VALUE for each of the stack's defaults (HOROVOD_DEFAULTS, then `extra`) that the user's --env pairs do
    not set themselves."""
    chosen = {check_env_assignment(item).partition("=")[0] for item in env}
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


NIC_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE")
"""What pins NCCL's and Gloo's traffic to one NIC (Open MPI's own settings are separate)."""


def nic_variables(network_interface: str | None) -> list[str]:
    """NIC_VARIABLES set to one NIC. NCCL takes a bare name as a prefix (eth0 would also match eth01); a leading `=`
    makes it exact, as Gloo's are."""
    if not network_interface:
        return []
    return [f"{name}={'=' if name.startswith('NCCL') else ''}{network_interface}" for name in NIC_VARIABLES]


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
    driver_nic: str | None = None,
    discovery_script: str = DISCOVERY_SCRIPT,
) -> list[str]:
    """The one horovodrun command line of an elastic job (Gloo): it starts max_ranks ranks on the hosts that
    DISCOVERY_SCRIPT lists, carries on while at least min_ranks remain, takes returning hosts back, and gives up
    after elastic_timeout seconds below the minimum. horovodrun hands its own environment to every rank and runs
    them in its own working directory, hence `env -C WORKDIR VARIABLES...` in front. The discovery script reads
    the job's workers from the job spec (launcher.agent discover). With a subnet for a NIC, horovodrun is given
    its own host's NIC in it (`driver_nic`: it serves the ranks' rendezvous there) and each rank finds its own
    (rank_command)."""
    if not network_interface:
        # Without it horovodrun probes every host pair for common NICs and, with all slots on one host, waits for
        # that probe until it times out.
        raise ValueError(
            "elastic training needs the NIC the nodes reach each other on: pass --network-interface "
            "(e.g. eth0; `ip -br addr` on a node lists them)"
        )
    own_nic = driver_nic if subnet_of(network_interface) else network_interface
    if not own_nic:
        raise ValueError(f"elastic training over the subnet {network_interface} needs rank 0's NIC in it")
    command = trainer_with(command, "--elastic")  # the bundled trainer's loop; a user's script brings its own
    defaults = defaults_unless_set(env, {"HOROVOD_GLOO_TIMEOUT_SECONDS": str(ELASTIC_GLOO_TIMEOUT_SECONDS)})
    user_set = frozenset(check_env_assignment(item).partition("=")[0] for item in env)
    variables = [
        *nic_variables(own_nic),
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
        discovery_script,
        "--network-interface",
        own_nic,
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
    slots: int | None = None
    """Its ranks (a node's count from --nodes HOST:SLOTS or --hostfile); None: the job's slots."""


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
    excluded_subnets: tuple[str, ...] = ()
    """With no NIC pinned: the subnets of the workers' hosts' virtual NICs, which Open MPI leaves out
    (nic_selection)."""
    across_hosts: bool = False
    """The workers are on more than one host (the multi-host launcher): an unpinned NIC is not left to chance."""
    driver_nic: str | None = None
    """With a subnet for network_interface: rank 0's host's NIC in it (elastic horovodrun serves there)."""
    discovery_script: str = DISCOVERY_SCRIPT
    """Elastic: the host discovery horovodrun runs (the agent's own, or the MPI Operator's in an MPIJob)."""
    env: tuple[str, ...] = ()
    """KEY=VALUE pairs every rank gets."""
    workdir: str | None = None
    """The job's working directory in every container (WORKDIR), when the user's code is there."""
    elastic_min_workers: int | None = None
    elastic_max_workers: int | None = None
    elastic_timeout: int = ELASTIC_TIMEOUT_SECONDS
    ready_timeout: float = READY_TIMEOUT_SECONDS
    stall_timeout: int = STALL_TIMEOUT_SECONDS
    """Seconds without output or new metrics after which the job counts as stalled (0: never)."""
    stall_action: str = "warn"
    """On a stall: gather the stacks and record it (warn), or also end the job (fail)."""
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

    def slots_of(self, worker: Worker) -> int:
        return worker.slots or self.slots

    def rank_counts(self) -> list[int]:
        """Each expected worker's ranks: the listed workers' own counts, or the job's slots for each."""
        return [self.slots_of(worker) for worker in self.workers] or [self.slots] * self.expected_workers

    def job_argv(self) -> list[str]:
        """The job's one command line: mpirun over HOSTFILE_PATH, or elastic horovodrun over the discovery."""
        if not self.elastic:
            return mpirun_argv(
                ranks=sum(self.rank_counts()),
                hostfile=HOSTFILE_PATH,
                command=self.command,
                network_interface=self.network_interface,
                excluded_subnets=self.excluded_subnets,
                across_hosts=self.across_hosts,
                env=self.env,
                workdir=self.workdir,
            )
        assert self.elastic_min_workers is not None
        # Counts that differ between hosts: the minimum holds whichever hosts remain, the maximum whichever join.
        counts = sorted(self.rank_counts())
        return horovodrun_argv(
            min_ranks=sum(counts[: self.elastic_min_workers]),
            max_ranks=sum(counts[::-1][: self.elastic_max_workers or self.expected_workers]),
            slots_per_host=self.slots,
            network_interface=self.network_interface,
            ssh_port=self.ssh_port,
            elastic_timeout=self.elastic_timeout,
            command=self.command,
            env=self.env,
            workdir=self.workdir,
            driver_nic=self.driver_nic,
            discovery_script=self.discovery_script,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        known = {item.name for item in fields(cls)}
        data = {key: value for key, value in json.loads(text).items() if key in known}  # a newer launcher's extras
        tuples = {key: tuple(data.get(key, ())) for key in ("command", "env", "excluded_subnets")}
        workers = tuple(Worker(**worker) for worker in data["workers"])
        return cls(**{**data, **tuples, "workers": workers, "words": DoorWords(**data["words"])})


@dataclass(frozen=True)
class Node:
    name: str
    """The name mpirun and ssh use for this host; it must resolve to the host on every node."""
    engine_url: str
    """How the launcher reaches the node's Docker engine: ssh://NAME by default, or an override."""
    slots: int | None = None
    """Its ranks, from --nodes HOST:SLOTS or --hostfile (with GPUs: its GPUs, one rank each); None: the default."""


@dataclass(frozen=True)
class GpuRequest:
    """Docker's device request for GPUs: `count` of them, or the ones named (an index or a UUID each)."""

    count: int = 0
    device_ids: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"GPUs {','.join(self.device_ids)}" if self.device_ids else f"{self.count} GPU(s)"


@dataclass(frozen=True)
class Bind:
    """A host folder in every worker (--mount HOST_PATH:CONTAINER_PATH[:ro]), e.g. a dataset on each node's disk."""

    source: str
    target: str
    read_only: bool = False

    def __str__(self) -> str:
        return f"{self.source} -> {self.target}{' (read-only)' if self.read_only else ''}"


RESERVED_PATHS = (SHARED_MOUNT, WORKDIR, HOME, "/cluster", "/opt/horovod-stack")
"""Where the stack's own files live in a worker: a --mount may not cover them."""


def parse_bind(text: str) -> Bind:
    """HOST_PATH:CONTAINER_PATH[:ro|rw], both absolute; raises ValueError naming the fix."""
    parts = text.split(":")
    mode = parts.pop() if len(parts) == 3 and parts[2] in ("ro", "rw") else "rw"
    if len(parts) != 2 or not all(part.startswith("/") for part in parts):
        raise ValueError(f"--mount {text!r} is not HOST_PATH:CONTAINER_PATH[:ro], both absolute: e.g. /data:/data:ro")
    target = str(Path(parts[1]))
    covered = [path for path in RESERVED_PATHS if path == target or path.startswith(target.rstrip("/") + "/")]
    if covered:
        raise ValueError(f"--mount {text!r} would hide the stack's own {covered[0]}: mount it elsewhere, e.g. /data")
    return Bind(str(Path(parts[0])), target, mode == "ro")


@dataclass(frozen=True)
class WorkerContainer:
    """One worker container as the launcher starts it: host networking (ranks talk over the node's own NICs)."""

    image: str
    name: str
    labels: dict[str, str]
    environment: dict[str, str]
    shm_size: str
    volumes: dict[str, str]
    """Host folder or volume name -> path in the container (the shared folder)."""
    gpu: GpuRequest | None
    ulimits: dict[str, int]
    capabilities: tuple[str, ...]
    devices: tuple[str, ...]
    """HOST_PATH:CONTAINER_PATH, each."""
    binds: tuple[Bind, ...]
    """The user's host folders (--mount), which must exist on the node."""


@dataclass(frozen=True)
class ClusterPlan:
    cluster_id: str
    nodes: tuple[Node, ...]
    image: str
    slots_per_node: int
    """Ranks on a node without a count of its own (Node.slots)."""
    gpus_per_node: int
    """GPUs per node (one rank each) for nodes without a count of their own; 0: CPU ranks."""
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
    binds: tuple[Bind, ...] = ()
    """The user's host folders in every worker (--mount)."""
    gpu_ids: tuple[str, ...] = ()
    """The GPUs each node's worker gets, by index or UUID (--gpus 0,1); empty: any gpus_per_node of them."""
    excluded_subnets: tuple[str, ...] = ()
    """The subnets of the nodes' virtual NICs (virtual_subnets), found by the node checks, when no NIC is pinned."""
    node_nics: tuple[tuple[str, str], ...] = ()
    """(node name, NIC) in the subnet network_interface names, as the node checks found them."""
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
    stall_timeout: int = STALL_TIMEOUT_SECONDS
    stall_action: str = "warn"

    @property
    def rank0(self) -> Node:
        return self.nodes[0]

    def slots(self, node: Node) -> int:
        return node.slots or self.slots_per_node

    @property
    def total_ranks(self) -> int:
        return sum(self.slots(node) for node in self.nodes)

    def container_name(self, node: Node) -> str:
        return f"horovod-stack-{self.cluster_id}-{node.name}"

    def labels(self, node: Node) -> dict[str, str]:
        return {
            LABEL_CLUSTER: self.cluster_id,
            LABEL_NODE: node.name,
            LABEL_ROLE: "rank0" if node == self.rank0 else "worker",
            LABEL_RANKS: str(self.slots(node)),
        }

    def worker_environment(self, node: Node) -> dict[str, str]:
        # No secret here: keys reach the container as files through the API after it starts.
        environment = {"SSH_PORT": str(self.ssh_port), "WORKER_ADDRESS": node.name}
        if node == self.rank0:
            environment["EXIT_WITH_JOB"] = "1"  # rank 0's container stops with the job's exit status
        return environment

    def gpu_request(self, node: Node) -> GpuRequest | None:
        """The device request the worker on `node` makes (the same as doctor's and start's nvidia-smi check)."""
        if not self.gpus_per_node:
            return None
        return GpuRequest(device_ids=self.gpu_ids) if self.gpu_ids else GpuRequest(count=self.slots(node))

    def worker_container(self, node: Node) -> WorkerContainer:
        """Everything the worker container on `node` is started with (driver.start_worker passes it to Docker)."""
        gpu = self.gpu_request(node)
        return WorkerContainer(
            image=self.image,
            name=self.container_name(node),
            labels=self.labels(node),
            environment=self.worker_environment(node),
            shm_size=self.shm_size,
            volumes={self.shared_dir: SHARED_MOUNT},
            binds=self.binds,
            gpu=gpu,
            ulimits=GPU_WORKER_ULIMITS if gpu else WORKER_ULIMITS,
            capabilities=WORKER_CAPABILITIES,
            devices=tuple(device if ":" in device else f"{device}:{device}" for device in self.devices),
        )

    def mpi_host(self, node: Node) -> str:
        return mpi_host(node.name, dict(self.addresses).get(node.name))

    def needs_addresses(self) -> list[Node]:
        return [node for node in self.nodes if not OPEN_MPI_HOST_NAME.match(node.name)]

    def workers(self) -> tuple[Worker, ...]:
        return tuple(Worker(node.name, self.mpi_host(node), self.slots(node)) for node in self.nodes)

    @property
    def elastic(self) -> bool:
        return self.elastic_min_nodes is not None

    def job_spec(self, keep_running: bool = False) -> JobSpec:
        """The job the agent in rank 0's container runs. (Before the addresses are resolved, as when the plan is
        first logged, a name Open MPI would refuse stands for itself.)"""
        resolved = dict(self.addresses)
        workers = tuple(
            Worker(node.name, mpi_host(node.name, resolved.get(node.name, node.name)), self.slots(node))
            for node in self.nodes
        )
        return JobSpec(
            job_id=self.cluster_id,
            command=self.command,
            expected_workers=len(self.nodes),
            slots=self.slots_per_node,
            workers=workers,
            ssh_port=self.ssh_port,
            network_interface=self.network_interface,
            excluded_subnets=() if self.network_interface else self.excluded_subnets,
            across_hosts=len(self.nodes) > 1,
            driver_nic=dict(self.node_nics).get(self.rank0.name),
            workdir=WORKDIR if self.workdir else None,
            elastic_min_workers=self.elastic_min_nodes,
            elastic_max_workers=self.elastic_max_nodes,
            elastic_timeout=self.elastic_timeout,
            ready_timeout=self.ready_timeout,
            stall_timeout=self.stall_timeout,
            stall_action=self.stall_action,
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

    def dry_run_report(self, image_id: str | None) -> str:
        """What a start would do, node by node (the container, never a key: keys reach containers as files after
        they start), then the hostfile and the job's command line."""
        spec = self.job_spec()
        lines = [f"plan: {self.total_ranks} ranks on {len(self.nodes)} node(s); a start gives the cluster a new ID"]
        for node in self.nodes:
            container = self.worker_container(node)
            mounts = [f"{source} -> {target}" for source, target in container.volumes.items()]
            mounts += [str(bind) for bind in container.binds]
            if self.workdir:
                mounts.append(f"{self.workdir} -> {WORKDIR} (copied)")
            nic = dict(self.node_nics).get(node.name)
            limits = ", ".join(f"{name}={limit}" for name, limit in container.ulimits.items())
            lines += [
                f"{node.name} ({'rank 0, runs the job agent' if node == self.rank0 else 'worker'}; engine "
                f"{node.engine_url})",
                f"  container {container.name}: image {container.image} "
                f"({image_id[7:19] if image_id else 'to be copied'}), network host"
                f"{f' (NIC {nic})' if nic else ''}, shared memory {container.shm_size}",
                f"  ranks {self.slots(node)}; GPUs {container.gpu or 'none'}; ulimits {limits}; capabilities "
                f"{','.join(container.capabilities)}; devices {', '.join(container.devices) or 'none'}",
                f"  mounts {'; '.join(mounts)}",
                f"  environment {', '.join(container.environment)} (names only)",
            ]
        lines.append(f"hostfile {HOSTFILE_PATH}:" if not spec.elastic else "elastic host discovery answers:")
        lines += [
            f"  {worker.address} slots={spec.slots_of(worker)}"
            if not spec.elastic
            else f"  {worker.address}:{spec.slots_of(worker)}"
            for worker in spec.workers
        ]
        lines.append(f"{spec.program}: {' '.join(spec.job_argv())}")
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        """The effective plan in a few lines, logged once at start."""
        nodes = ", ".join(
            f"{node.name}: {self.slots(node)} rank(s){f' on {gpu}' if (gpu := self.gpu_request(node)) else ''}"
            f"{f' over {nic}' if (nic := dict(self.node_nics).get(node.name)) else ''} ({node.engine_url})"
            for node in self.nodes
        )
        code = f", code {self.workdir} -> {WORKDIR}" if self.workdir else ""
        elastic = (
            f", elastic: at least {self.elastic_min_nodes} of {self.elastic_max_nodes or len(self.nodes)} "
            f"nodes (waits {self.elastic_timeout} s below that)"
            if self.elastic
            else ""
        )
        spec = self.job_spec()
        nic_default = "any but " + ",".join(VIRTUAL_NIC_PREFIXES) if len(self.nodes) > 1 else "any"
        return (
            f"cluster {self.cluster_id}: {self.total_ranks} ranks on {len(self.nodes)} node(s) [{nodes}], image "
            f"{self.image}, ssh port {self.ssh_port}, NIC {self.network_interface or nic_default}, shared "
            f"{self.shared_dir}{code}{elastic}\n{spec.program}: {' '.join(spec.job_argv())}"
        )
