"""The launch plan: from nodes, slots and settings to container specs, the hostfile and the mpirun argv.

Pure functions of their inputs, with no Docker or network access, so every line mpirun will see is unit-tested.
Both front doors build their mpirun command line here: the multi-host launcher through ClusterPlan, compose's
launcher role (docker/entrypoint.sh) through `python -m launcher.job_argv`.
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
WORKDIR = "/workdir"
"""Where the user's code sits in every container (--workdir, compose's WORKDIR); the job's working directory."""
TRAINER = ("python", "-m", "app.train")
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
        nic = network_interface
        argv += ["--mca", "btl_tcp_if_include", nic, "--mca", "oob_tcp_if_include", nic,
                 "-x", f"NCCL_SOCKET_IFNAME={nic}", "-x", f"GLOO_SOCKET_IFNAME={nic}",
                 "-x", f"HOROVOD_GLOO_IFACE={nic}"]
    for item in env:
        argv += ["-x", check_env_assignment(item)]
    argv += [word for name, value in HOROVOD_DEFAULTS.items() if not any(item.startswith(f"{name}=") for item in env)
             for word in ("-x", f"{name}={value}")]
    if workdir:
        argv += ["-wdir", workdir]
    return argv + list(command)


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

    def mpirun_argv(self) -> list[str]:
        return mpirun_argv(ranks=self.total_ranks, hostfile=HOSTFILE_PATH, command=self.command,
                           network_interface=self.network_interface, env=self.env,
                           workdir=WORKDIR if self.workdir else None)

    def detached_job_script(self, keep_running: bool = False) -> str:
        """The bash script rank 0 runs for a detached job: mpirun into JOB_LOG, its status into JOB_STATUS, then
        (unless keep_running) JOB_END_FILE on every other node over ssh and on rank 0 itself, so every worker's
        container stops once the job ends, success or failure, with no launcher process needed."""
        lines = [f"{shlex.join(self.mpirun_argv())} > {JOB_LOG} 2>&1", "status=$?",
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
        return (f"cluster {self.cluster_id}: {self.total_ranks} ranks on {len(self.nodes)} nodes [{nodes}], "
                f"{self.slots_per_node} slot(s) per node{', GPUs' if self.gpus_per_node else ''}, image "
                f"{self.image}, ssh port {self.ssh_port}, NIC {self.network_interface or 'any'}, shared "
                f"{self.shared_dir}{code}\nmpirun: {' '.join(self.mpirun_argv())}")
