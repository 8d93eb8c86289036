"""The launch plan: from nodes, slots and settings to container specs, the hostfile and the mpirun argv.

Pure functions of their inputs, with no Docker or network access, so every line mpirun will see is unit-tested.
Both front doors build their job's command line here (mpirun, or horovodrun for elastic training): the
multi-host launcher through ClusterPlan, compose's launcher role (docker/entrypoint.sh) through
`python -m launcher.job_argv`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath as Path

LABEL_CLUSTER = "horovod-stack.cluster"
LABEL_NODE = "horovod-stack.node"
LABEL_ROLE = "horovod-stack.role"
CONTAINER_SSH_DIR = "/home/mpiuser/.ssh"
HOSTFILE_PATH = "/home/mpiuser/hostfile"
JOB_LOG = "/home/mpiuser/job.log"
JOB_STATUS = "/home/mpiuser/job.status"
"""A detached job's output and, once it has ended, its exit status, in the rank-0 container."""
JOB_END_FILE = "/cluster/ssh/job-ended"
"""Seen by each worker's entrypoint: when it appears the worker's sshd exits and its container stops."""
SHARED_MOUNT = "/shared"
RUNS_DIR = f"{SHARED_MOUNT}/runs"
"""Each cluster's trainer run writes into RUNS_DIR/<cluster id> (run_dir): metrics, checkpoints, TensorBoard."""
NIC_SETTING = "NODE_NETWORK_INTERFACE"
"""The launcher's .env key for the NIC; compose's NETWORK_INTERFACE names a NIC of its containers, not the nodes'."""
WORKDIR = "/workdir"
"""Where the user's code sits in every container (--workdir, compose's WORKDIR); the job's working directory."""
TRAINER = ("python", "-m", "app.train")
DISCOVERY_SCRIPT = "/opt/horovod-stack/docker/discover-hosts.sh"
"""Elastic Horovod's host discovery, in the image: prints HOST:SLOTS for each worker whose sshd answers now."""
ELASTIC_GLOO_TIMEOUT_SECONDS = 10
"""How long a rank waits on a silent peer before its collective fails (Horovod's default: 30 s). A killed worker's
peers often get no TCP reset, so this bounds how soon an elastic job notices the loss; --env
HOROVOD_GLOO_TIMEOUT_SECONDS=N overrides it for steps where ranks legitimately wait longer."""
ELASTIC_TIMEOUT_SECONDS = 60
"""How long an elastic job waits below its minimum for workers to come back (ELASTIC_TIMEOUT) before it fails."""
BLACKLIST_COOLDOWN_SECONDS = (2, 30)
"""A host whose worker failed may rejoin after 4-6 s, doubling on each further failure (horovodrun's range)."""
HOROVOD_DEFAULTS: dict[str, str] = {"OMPI_MCA_mpi_yield_when_idle": "1"}
"""Settings for Horovod and the MPI under it that every job gets unless the user's --env sets them (README
"Performance", measured with `python -m app.bench peers`): Open MPI yields the core while it waits, instead of
spinning against the rank's own compute threads (Horovod's background thread polls MPI every cycle)."""
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
    if command[:len(TRAINER)] != list(TRAINER) or any(word.split("=")[0] == flag for word in command):
        return command
    return [*command, flag, *value]


def with_run_dir(command: list[str] | tuple[str, ...], folder: str) -> list[str]:
    """The bundled trainer writes each run into a folder of its own (metrics, checkpoints, TensorBoard, curves),
    so a second run never overwrites the first's."""
    return trainer_with(command, "--run-dir", folder)


def nic_problem(wanted: str | None, nics: list[str] | tuple[str, ...]) -> str | None:
    """Why a node cannot use the NIC `wanted`, given the NICs it has; None if it can, or if none is asked for.
    Gloo and Horovod take one exact name (no prefix or subnet, as NCCL and Open MPI would), so it must match."""
    if not wanted or wanted in nics:
        return None
    return (f"no network interface {wanted} there (it has {', '.join(sorted(nics)) or 'none'}); pass "
            f"--network-interface with one of them, or set {NIC_SETTING} in .env")


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


def mpirun_argv(*, ranks: int, hostfile: str, command: list[str] | tuple[str, ...],
                network_interface: str | None = None, env: tuple[str, ...] = (),
                workdir: str | None = None) -> list[str]:
    """The one mpirun command line of a job: the seed article's flags, NIC selection for Open MPI, NCCL and
    Gloo, the user's variables (-x), the stack's Horovod defaults the user did not set, the working directory,
    then the command every rank runs."""
    argv = ["mpirun", "-np", str(ranks), "--hostfile", hostfile, "-bind-to", "none", "-map-by", "slot",
            # Only the launching container holds the cluster's private key, so it starts every remote daemon.
            "--mca", "plm_rsh_no_tree_spawn", "1",
            "-x", "NCCL_DEBUG=INFO", "-x", "PATH", "-x", "PYTHONPATH"]
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
    """The variables that pin NCCL's and Gloo's traffic to one NIC (Open MPI's own flags are separate)."""
    nic = network_interface
    return [f"NCCL_SOCKET_IFNAME={nic}", f"GLOO_SOCKET_IFNAME={nic}", f"HOROVOD_GLOO_IFACE={nic}"] if nic else []


def horovodrun_argv(*, min_ranks: int, max_ranks: int, slots_per_host: int, network_interface: str | None,
                    ssh_port: int, elastic_timeout: int, command: list[str] | tuple[str, ...],
                    job_id: str, env: tuple[str, ...] = (), workdir: str | None = None,
                    discovery_env: tuple[str, ...] = ()) -> list[str]:
    """The one horovodrun command line of an elastic job (Gloo): it starts max_ranks ranks on the hosts that
    DISCOVERY_SCRIPT lists, carries on while at least min_ranks remain, takes returning hosts back, and gives up
    after elastic_timeout seconds below the minimum. horovodrun hands its own environment to every rank and runs
    them in its own working directory, hence `env -C WORKDIR VARIABLES...` in front. job_id (ELASTIC_JOB) lets
    the discovery script tell this job's first call from later ones (docker/entrypoint.sh, discover_hosts)."""
    if not network_interface:
        # Without it horovodrun probes every host pair for common NICs and, with all slots on one host, waits for
        # that probe until it times out.
        raise ValueError("elastic training needs the NIC the nodes reach each other on: pass --network-interface "
                         "(e.g. eth0; `ip -br addr` on a node lists them)")
    command = trainer_with(command, "--elastic")  # the bundled trainer's loop; a user's script brings its own
    defaults = defaults_unless_set(env, {"HOROVOD_GLOO_TIMEOUT_SECONDS": str(ELASTIC_GLOO_TIMEOUT_SECONDS)})
    variables = [*discovery_env, f"ELASTIC_JOB={job_id}", "NCCL_DEBUG=INFO", *nic_variables(network_interface),
                 *defaults, *(check_env_assignment(item) for item in env)]
    return ["env", *(["-C", workdir] if workdir else []), *variables,
            "horovodrun", "--gloo", "-np", str(max_ranks), "--min-np", str(min_ranks), "--max-np", str(max_ranks),
            "--slots-per-host", str(slots_per_host), "--host-discovery-script", DISCOVERY_SCRIPT,
            "--network-interface", network_interface, "--ssh-port", str(ssh_port),
            "--elastic-timeout", str(elastic_timeout),
            "--blacklist-cooldown-range", *map(str, BLACKLIST_COOLDOWN_SECONDS), *command]


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

    @property
    def rank0(self) -> Node:
        return self.nodes[0]

    @property
    def total_ranks(self) -> int:
        return self.slots_per_node * len(self.nodes)

    def container_name(self, node: Node) -> str:
        return f"horovod-stack-{self.cluster_id}-{node.name}"

    def labels(self, node: Node) -> dict[str, str]:
        return {LABEL_CLUSTER: self.cluster_id, LABEL_NODE: node.name,
                LABEL_ROLE: "rank0" if node == self.rank0 else "worker"}

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

    def hostfile(self) -> str:
        return "".join(f"{self.mpi_host(node)} slots={self.slots_per_node}\n" for node in self.nodes)

    def known_hosts(self, host_keys: dict[str, str]) -> str:
        """known_hosts lines pinning each node's worker host key ('TYPE BASE64') on the SSH port."""
        return "".join(f"[{self.mpi_host(node)}]:{self.ssh_port} {host_keys[node.name]}\n" for node in self.nodes)

    def ssh_config(self) -> str:
        return (f"Host *\n  Port {self.ssh_port}\n  IdentityFile {CONTAINER_SSH_DIR}/id_ed25519\n"
                f"  IdentitiesOnly yes\n  UserKnownHostsFile {CONTAINER_SSH_DIR}/known_hosts\n"
                "  StrictHostKeyChecking yes\n  BatchMode yes\n  ConnectTimeout 10\n  LogLevel ERROR\n")

    @property
    def elastic(self) -> bool:
        return self.elastic_min_nodes is not None

    def job_argv(self) -> list[str]:
        """What rank 0's container runs: mpirun, or horovodrun for an elastic job."""
        workdir = WORKDIR if self.workdir else None
        if not self.elastic:
            return mpirun_argv(ranks=self.total_ranks, hostfile=HOSTFILE_PATH, command=self.command,
                               network_interface=self.network_interface, env=self.env, workdir=workdir)
        # Rank 0's node first: the driver lives there. (Before the addresses are resolved, as when the plan is first
        # logged, a name Open MPI would refuse stands for itself.)
        resolved = dict(self.addresses)
        hosts = ",".join(mpi_host(node.name, resolved.get(node.name, node.name)) for node in self.nodes)
        return horovodrun_argv(
            min_ranks=self.elastic_min_nodes * self.slots_per_node,
            max_ranks=(self.elastic_max_nodes or len(self.nodes)) * self.slots_per_node,
            slots_per_host=self.slots_per_node, network_interface=self.network_interface, ssh_port=self.ssh_port,
            elastic_timeout=self.elastic_timeout, command=self.command, job_id=self.cluster_id, env=self.env,
            workdir=workdir,
            discovery_env=(f"WORKER_HOSTS={hosts}", f"SLOTS_PER_WORKER={self.slots_per_node}",
                           f"SSH_PORT={self.ssh_port}"))

    def detached_job_script(self, keep_running: bool = False) -> str:
        """The bash script rank 0 runs for a detached job: job_argv into JOB_LOG, its status into JOB_STATUS, then
        (unless keep_running) JOB_END_FILE on every other node over ssh and on rank 0 itself, so every worker's
        container stops once the job ends, success or failure, with no launcher process needed."""
        lines = [f"{shlex.join(self.job_argv())} > {JOB_LOG} 2>&1", "status=$?",
                 f'echo "$status" > {JOB_STATUS}']
        if not keep_running:
            for node in self.nodes[1:]:
                lines.append(f'ssh {shlex.quote(self.mpi_host(node))} "echo \'exit status $status\' > {JOB_END_FILE}"'
                             " || true")
            lines.append(f'echo "exit status $status" > {JOB_END_FILE}')
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        """The effective plan in a few lines, logged once at start."""
        nodes = ", ".join(f"{node.name} ({node.engine_url})" for node in self.nodes)
        code = f", code {self.workdir} -> {WORKDIR}" if self.workdir else ""
        elastic = (f", elastic: at least {self.elastic_min_nodes} of {self.elastic_max_nodes or len(self.nodes)} "
                   f"nodes (waits {self.elastic_timeout} s below that)" if self.elastic else "")
        program = "horovodrun" if self.elastic else "mpirun"
        return (f"cluster {self.cluster_id}: {self.total_ranks} ranks on {len(self.nodes)} nodes [{nodes}], "
                f"{self.slots_per_node} slot(s) per node{', GPUs' if self.gpus_per_node else ''}, image "
                f"{self.image}, ssh port {self.ssh_port}, NIC {self.network_interface or 'any'}, shared "
                f"{self.shared_dir}{code}{elastic}\n{program}: {' '.join(self.job_argv())}")
