"""The launch plan: the settings (where and how to run the job) plus what the node checks found, as the worker
containers to start, the labels that find them again, and the job spec the agent in rank 0's container runs.

Pure: no Docker or network access, so every container and every line mpirun will see is unit-tested. The plan is
made once the node checks have run (launcher.host.planning.preflight), with what they found (Found); before that, the
settings alone describe the job.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field

from app import frameworks
from app.frameworks import Framework
from app.gpu import FRAMEWORK_LABEL
from launcher.core import restart
from launcher.core.jobspec import JobSpec, Worker, run_paths
from launcher.core.mounts import Bind
from launcher.core.nics import VIRTUAL_NIC_PREFIXES
from launcher.core.protocol import (
    GPU_WORKER_ULIMITS,
    HOSTFILE_PATH,
    PTRACE_CAPABILITY,
    RUNS_DIR,
    SECRET_SHOWN,
    SHARED_MOUNT,
    WORKDIR,
    WORKER_CAPABILITIES,
    WORKER_ULIMITS,
    WORKER_USER,
)
from launcher.host.planning.access import CONNECT_TIMEOUT_S, EngineTls
from launcher.host.planning.settings import LaunchSettings

LABEL_CLUSTER = "horovod-stack.cluster"
LABEL_NODE = "horovod-stack.node"
LABEL_ROLE = "horovod-stack.role"
LABEL_RANKS = "horovod-stack.ranks"
LABEL_IMAGE = "horovod-stack.image"
LABEL_METRICS = "horovod-stack.metrics"
"""On rank 0's container: where the bundled trainer writes its metrics (JobSpec.metrics_file), which `status` reads."""
"""The image the cluster runs, as the plan named it: `logs` and `results` read the shared folder with it, so that no
engine is asked to pull another image."""
# Open MPI 4 refuses host names outside RFC 952 (an underscore, as in node_1, stops mpirun).
OPEN_MPI_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*")


def mpi_host(name: str, address: str | None) -> str:
    """The name mpirun and ssh use for a node: its own name where Open MPI accepts it, else its address."""
    if OPEN_MPI_HOST_NAME.fullmatch(name):
        return name
    if not address:
        raise ValueError(f"{name} needs an address: Open MPI does not accept it as a host name")
    return address


HOST_NAME_LIMIT = 63
NOT_IN_HOST_NAMES = re.compile(r"[^a-z0-9-]+")


def worker_host_names(nodes: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Each node's worker's host name: the node's name made a valid host name, unique in the cluster. Open MPI tells
    nodes apart by host name, and a host-network container otherwise takes its host's, which servers cloned from one
    image share (`ubuntu`, `localhost`): two nodes of one name crash Open MPI's start. Dots go too, since Open MPI
    drops a host name's domain (gpu1.lab-a and gpu1.lab-b would both be gpu1)."""
    names: dict[str, str] = {}
    for node in nodes:
        base = NOT_IN_HOST_NAMES.sub("-", node.lower()).strip("-")[:HOST_NAME_LIMIT].strip("-") or "node"
        name, count = base, 1
        while name in names.values():
            count += 1
            name = f"{base[: HOST_NAME_LIMIT - len(str(count)) - 1]}-{count}"
        names[node] = name
    return names


def run_dir(cluster_id: str) -> str:
    """The bundled trainer's --run-dir for a cluster, in the shared mount."""
    return f"{RUNS_DIR}/{cluster_id}"


@dataclass(frozen=True)
class Node:
    name: str
    """The name mpirun and ssh use for this host; it must resolve to the host on every node."""
    engine_url: str
    """How the launcher reaches the node's Docker engine: ssh://NAME by default, or an override."""
    slots: int | None = None
    """Its ranks, from --nodes HOST:SLOTS or --hostfile (with GPUs: its GPUs, one rank each); None: the default."""
    connect_timeout: float = CONNECT_TIMEOUT_S
    """How long reaching its engine may take before the launcher gives up on the node."""
    tls: EngineTls | None = None
    """The Docker CLI's TLS variables for its engine (launcher.host.planning.access); None: none set."""


@dataclass(frozen=True)
class GpuRequest:
    """Docker's device request for GPUs: `count` of them, or the ones named (an index or a UUID each)."""

    count: int = 0
    device_ids: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"GPUs {','.join(self.device_ids)}" if self.device_ids else f"{self.count} GPU(s)"


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
    user: str
    """uid:gid that sshd and every rank run as (WORKER_USER)."""
    capabilities: tuple[str, ...]
    """Added back after dropping all (cap_drop ALL)."""
    no_new_privileges: bool
    """No file capability or setuid bit takes effect (without SYS_PTRACE, py-spy's file capability has no use)."""
    devices: tuple[str, ...]
    """HOST_PATH:CONTAINER_PATH, each."""
    binds: tuple[Bind, ...]
    """The user's host folders (--mount), which must exist on the node."""
    hostname: str
    """Its own host name (worker_host_names), not the host's."""
    extra_hosts: dict[str, str]
    """Every worker's host name -> its node's address, in the container's /etc/hosts."""
    restarts: int = 0
    """How often the node's engine starts the container again after it failed (crashed, or was killed by a signal
    such as the kernel's out-of-memory kill): Docker's on-failure restart policy, so the restarts need neither the
    launcher nor rank 0's container (--restart-workers, --worker-restarts). 0: never. A container stopped by hand
    (`docker stop`, `docker kill`) is not started again."""


@dataclass(frozen=True)
class Found:
    """What the node checks found that the job needs (launcher.host.planning.preflight.found)."""

    node_nics: tuple[tuple[str, str], ...] = ()
    """(node name, NIC) in the subnet the job's NIC names."""
    addresses: tuple[tuple[str, str], ...] = ()
    """(node name, IPv4 address) as rank 0 resolves them: the hostfile's address for a name Open MPI refuses, and
    each worker's host name's in every worker's /etc/hosts."""
    excluded_subnets: tuple[str, ...] = ()
    """The subnets of the nodes' virtual NICs, left out when no NIC is pinned across nodes."""
    listen_addresses: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(node name, addresses) its worker's sshd listens on, with a NIC pinned (nics.listen_addresses); a node not
    listed: every address."""


def nodes_of(settings: LaunchSettings) -> tuple[Node, ...]:
    """Every node the settings name, as the launcher reaches it: the job's (rank 0 first), then the spares."""
    return tuple(
        Node(
            name,
            settings.engine_url(name),
            settings.node_slots.get(name),
            settings.connect_timeout,
            settings.engine_tls.get(name),
        )
        for name in settings.all_nodes
    )


@dataclass(frozen=True)
class ClusterPlan:
    """One cluster: the settings, its ID (names, labels, run folder) and what the node checks found."""

    settings: LaunchSettings
    cluster_id: str
    found: Found = field(default_factory=Found)

    @classmethod
    def of(cls, settings: LaunchSettings, cluster_id: str | None = None, found: Found | None = None) -> ClusterPlan:
        """The plan for a new cluster (a new ID unless one is given)."""
        return cls(settings, cluster_id or secrets.token_hex(4), found or Found())

    @property
    def nodes(self) -> tuple[Node, ...]:
        """Every node that gets a worker: the job's (rank 0 first), then the spares."""
        return nodes_of(self.settings)

    @property
    def job_nodes(self) -> tuple[Node, ...]:
        """The nodes the job starts on, rank 0 first (not the spares)."""
        return tuple(node for node in self.nodes if not self.is_spare(node))

    def is_spare(self, node: Node) -> bool:
        return node.name in self.settings.spares

    @property
    def rank0(self) -> Node:
        return self.nodes[0]

    @property
    def slots_per_node(self) -> int:
        """Ranks on a node without a count of its own (Node.slots): LaunchSettings.ranks_per_node."""
        return self.settings.ranks_per_node

    def slots(self, node: Node) -> int:
        return self.settings.ranks_on(node.name)

    @property
    def total_ranks(self) -> int:
        return sum(self.slots(node) for node in self.job_nodes)

    def container_name(self, node: Node) -> str:
        return f"horovod-stack-{self.cluster_id}-{node.name}"

    def labels(self, node: Node) -> dict[str, str]:
        return {
            LABEL_CLUSTER: self.cluster_id,
            LABEL_NODE: node.name,
            LABEL_ROLE: "rank0" if node == self.rank0 else "spare" if self.is_spare(node) else "worker",
            LABEL_RANKS: str(self.slots(node)),
            LABEL_IMAGE: self.settings.image,
            **({FRAMEWORK_LABEL: self.framework.name} if self.framework else {}),
            **({LABEL_METRICS: self.metrics_file} if node == self.rank0 and self.metrics_file else {}),
        }

    @property
    def metrics_file(self) -> str | None:
        """The bundled trainer's metrics file (its --metrics-file or --run-dir, else the run folder's), laid out as
        the job spec lays it out; None for a command of the user's."""
        job = self.settings.job
        return run_paths(job.command, run_dir(self.cluster_id), job.can_restart).metrics_file

    @property
    def framework(self) -> Framework | None:
        """The framework the job runs, where the image is one of the stack's by name (an image FROM one of them
        carries that image's FRAMEWORK_LABEL into its containers itself); None: not known from its name."""
        return frameworks.of_image(self.settings.image)

    def worker_environment(self, node: Node) -> dict[str, str]:
        # No secret here: keys reach the container as files through the API after it starts.
        environment = {"SSH_PORT": str(self.settings.job.ssh_port), "WORKER_ADDRESS": node.name}
        listen = dict(self.found.listen_addresses).get(node.name)
        if listen:
            environment["SSH_LISTEN"] = ",".join(listen)
        if node == self.rank0:
            environment["EXIT_WITH_JOB"] = "1"  # rank 0's container stops with the job's exit status
        elif self.worker_restarts(node):
            environment["RESTART_ON_FAILURE"] = "1"  # started again by its engine only after it failed
        return environment

    def worker_restarts(self, node: Node) -> int:
        """How often `node`'s engine starts its failed worker again (--restart-workers): never rank 0's, which holds
        the elastic driver."""
        job = self.settings.job
        return restart.worker_restarts(job.restart_workers, job.worker_restarts, holds_driver=node == self.rank0)

    def gpu_request(self, node: Node) -> GpuRequest | None:
        """The device request the worker on `node` makes (the same as the GPU check's before a start)."""
        settings = self.settings
        if not settings.gpus_per_node:
            return None
        return GpuRequest(device_ids=settings.gpu_ids) if settings.gpu_ids else GpuRequest(count=self.slots(node))

    def worker_container(self, node: Node) -> WorkerContainer:
        """Everything the worker container on `node` is started with (the engine passes it to Docker)."""
        settings = self.settings
        gpu = self.gpu_request(node)
        host_names, addresses = worker_host_names(settings.all_nodes), dict(self.found.addresses)
        return WorkerContainer(
            image=settings.image,
            name=self.container_name(node),
            labels=self.labels(node),
            environment=self.worker_environment(node),
            shm_size=settings.shm_size,
            volumes={settings.shared_dir: SHARED_MOUNT},
            binds=settings.job.binds,
            gpu=gpu,
            ulimits=GPU_WORKER_ULIMITS if gpu else WORKER_ULIMITS,
            user=WORKER_USER,
            capabilities=(*WORKER_CAPABILITIES, *([PTRACE_CAPABILITY] if settings.job.ptrace else [])),
            no_new_privileges=not settings.job.ptrace,
            devices=tuple(device if ":" in device else f"{device}:{device}" for device in settings.devices),
            hostname=host_names[node.name],
            extra_hosts={host_names[name]: address for name, address in addresses.items()},
            restarts=self.worker_restarts(node),
        )

    def mpi_host(self, node: Node) -> str:
        return mpi_host(node.name, dict(self.found.addresses).get(node.name))

    def node_nic(self, node: Node) -> str | None:
        return dict(self.found.node_nics).get(node.name)

    def job_spec(self) -> JobSpec:
        """The job the agent in rank 0's container runs. (Before the addresses are resolved, as in a dry run of
        nodes that lack the image, a name Open MPI would refuse stands for itself.)"""
        settings, job = self.settings, self.settings.job
        resolved = dict(self.found.addresses)
        workers, spares = (
            tuple(
                Worker(node.name, mpi_host(node.name, resolved.get(node.name, node.name)), self.slots(node))
                for node in nodes
            )
            for nodes in (self.job_nodes, [node for node in self.nodes if self.is_spare(node)])
        )
        return JobSpec(
            job_id=self.cluster_id,
            options=job,
            run_folder=run_dir(self.cluster_id),
            expected_workers=len(workers),
            slots=self.slots_per_node,
            workers=workers,
            spares=spares,
            excluded_subnets=() if job.network_interface else self.found.excluded_subnets,
            across_hosts=len(self.nodes) > 1,
            driver_nic=self.node_nic(self.rank0),
            gpus=bool(settings.gpus_per_node),
            driver=f"rank 0's container on {self.rank0.name}",
            agent_host=workers[0].address,
            keep_running=settings.keep_running,
            results_hint=f"the shared folder {settings.shared_dir} on {self.rank0.name}",
        )

    def job_argv(self) -> list[str]:
        """What the agent in rank 0's container runs: mpirun, or horovodrun for an elastic job."""
        return self.job_spec().job_argv()

    def dry_run_report(self, image_id: str | None) -> str:
        """What a start would do, node by node (the container, never a key: keys reach containers as files after
        they start), then the hostfile and the job's command line."""
        spec = self.job_spec()
        spares = f" and {len(self.nodes) - len(self.job_nodes)} spare(s)" if self.settings.spares else ""
        lines = [
            f"plan: {self.total_ranks} ranks on {len(self.job_nodes)} node(s){spares}; a start gives the cluster a "
            "new ID"
        ]
        for node in self.nodes:
            container = self.worker_container(node)
            mounts = [f"{source} -> {target}" for source, target in container.volumes.items()]
            mounts += [str(bind) for bind in container.binds]
            if self.settings.job.workdir:
                mounts.append(f"{self.settings.job.workdir} -> {WORKDIR} (copied)")
            nic = self.node_nic(node)
            limits = ", ".join(f"{name}={limit}" for name, limit in container.ulimits.items())
            lines += [
                f"{node.name} ({self.role_words(node)}; engine {node.engine_url})",
                f"  container {container.name} (host name {container.hostname}): image {container.image} "
                f"({image_id[7:19] if image_id else 'not there yet'}), network host"
                f"{f' (NIC {nic})' if nic else ''}, shared memory {container.shm_size}",
                f"  ranks {self.slots(node)}; GPUs {container.gpu or 'none'}; ulimits {limits}; user "
                f"{container.user}; capabilities {','.join(container.capabilities)} (all others dropped"
                f"{'; no new privileges' if container.no_new_privileges else ''}); devices "
                f"{', '.join(container.devices) or 'none'}",
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
        if spec.options.secrets:
            shown = ", ".join(f"{name}={SECRET_SHOWN}" for name in spec.options.secrets)
            lines.append(f"secrets {shown} (to rank 0 as a 0600 file at start; to every rank by mpirun's -x NAME)")
        lines.append(f"{spec.program}: {' '.join(spec.job_argv())}")
        return "\n".join(lines) + "\n"

    def role_words(self, node: Node) -> str:
        if node == self.rank0:
            return "rank 0, runs the job agent"
        return "spare, out of the hostfile until a restart needs it" if self.is_spare(node) else "worker"

    def describe(self) -> str:
        """The effective plan in a few lines, logged once at start."""
        nodes = ", ".join(
            f"{node.name}: {self.slots(node)} rank(s){f' on {gpu}' if (gpu := self.gpu_request(node)) else ''}"
            f"{f' over {nic}' if (nic := self.node_nic(node)) else ''} ({node.engine_url})"
            for node in self.job_nodes
        )
        settings, job = self.settings, self.settings.job
        code = f", code {job.workdir} -> {WORKDIR}" if job.workdir else ""
        elastic = (
            f", elastic: at least {job.min_workers} of {job.elastic_max_workers or len(self.nodes)} "
            f"nodes (waits {job.elastic_timeout} s below that)"
            + (f", a failed worker started again {job.worker_restarts} time(s) at most" if job.restart_workers else "")
            if job.elastic
            else ""
        )
        restarts = (
            f", up to {job.max_restarts} restart(s)"
            + (f" on at least {job.min_workers} node(s)" if job.elastic_min_workers is not None else "")
            + (f", spares {','.join(settings.spares)}" if settings.spares else "")
            if job.can_restart
            else ""
        )
        spec = self.job_spec()
        nic_default = "any but " + ",".join(VIRTUAL_NIC_PREFIXES) if len(self.nodes) > 1 else "any"
        framework = f" ({self.framework.name})" if self.framework else ""
        return (
            f"cluster {self.cluster_id}: {self.total_ranks} ranks on {len(self.job_nodes)} node(s) [{nodes}], image "
            f"{settings.image}{framework}, ssh port {job.ssh_port}, NIC {job.network_interface or nic_default}, shared "
            f"{settings.shared_dir}{code}{elastic}{restarts}\n{spec.program}: {' '.join(spec.job_argv())}"
        )
