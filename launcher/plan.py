"""The launch plan: from nodes, slots and settings to container specs, the hostfile and the mpirun argv.

Pure functions of their inputs, with no Docker or network access, so every line mpirun will see is unit-tested.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LABEL_CLUSTER = "horovod-stack.cluster"
LABEL_NODE = "horovod-stack.node"
LABEL_ROLE = "horovod-stack.role"
CONTAINER_SSH_DIR = "/home/mpiuser/.ssh"
HOSTFILE_PATH = "/home/mpiuser/hostfile"
SHARED_MOUNT = "/shared"
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
    trainer_args: tuple[str, ...]
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
        return {"SSH_PORT": str(self.ssh_port), "WORKER_ADDRESS": node.name}

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
        argv = ["mpirun", "-np", str(self.total_ranks), "--hostfile", HOSTFILE_PATH,
                "-bind-to", "none", "-map-by", "slot",
                # Only the rank-0 container holds the cluster's private key, so it starts every remote daemon.
                "--mca", "plm_rsh_no_tree_spawn", "1",
                "-x", "NCCL_DEBUG=INFO", "-x", "PATH", "-x", "PYTHONPATH"]
        if self.network_interface:
            nic = self.network_interface
            argv += ["--mca", "btl_tcp_if_include", nic, "--mca", "oob_tcp_if_include", nic,
                     "-x", f"NCCL_SOCKET_IFNAME={nic}", "-x", f"GLOO_SOCKET_IFNAME={nic}",
                     "-x", f"HOROVOD_GLOO_IFACE={nic}"]
        return argv + ["python", "-m", "app.train", *self.trainer_args]

    def describe(self) -> str:
        """The effective plan in a few lines, logged once at start."""
        nodes = ", ".join(f"{node.name} ({node.engine_url})" for node in self.nodes)
        return (f"cluster {self.cluster_id}: {self.total_ranks} ranks on {len(self.nodes)} nodes [{nodes}], "
                f"{self.slots_per_node} slot(s) per node{', GPUs' if self.gpus_per_node else ''}, image "
                f"{self.image}, ssh port {self.ssh_port}, NIC {self.network_interface or 'any'}, shared "
                f"{self.shared_dir}\nmpirun: {' '.join(self.mpirun_argv())}")
