"""Launcher settings: read from a .env file (python-dotenv), overridden by flags, validated at construction.

Every error names the setting and the fix, so a bad value stops the launcher before it touches any node.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dotenv import dotenv_values

from launcher.plan import (
    NIC_SETTING,
    NODE_NAME,
    TRAINER,
    Bind,
    ClusterPlan,
    Node,
    check_env_assignment,
    parse_bind,
    run_dir,
    with_run_dir,
)
from launcher.protocol import ELASTIC_TIMEOUT_SECONDS, READY_TIMEOUT_SECONDS, SSH_PORT, STALL_TIMEOUT_SECONDS
from launcher.stall import STALL_ACTIONS
from launcher.workdir import payload_bytes

GPU_ID = re.compile(r"^(\d+|GPU-[0-9A-Fa-f-]+|MIG-[0-9A-Za-z/-]+)$")
"""A GPU as Docker's device request and nvidia-smi name it: an index, or a GPU's or MIG instance's UUID."""
GPUS_FIX = "pass a count (--gpus 2) or GPU IDs (--gpus 0,1; one GPU by ID: --gpus device=1)"

WORKDIR_LIMIT_BYTES = 256 * 1024**2
"""--workdir copies through the Docker API to every node; past this a derived image or a shared folder is the way."""


class SettingsError(ValueError):
    """A setting the launcher refuses; one line that names the fix."""


NODE_WITH_SLOTS = "HOST or HOST:SLOTS, as horovodrun's -H (node_1:4,node_2:2)"


def parse_node_list(text: str, source: str = "--nodes") -> list[tuple[str, int | None]]:
    """(host, ranks or None) for each `host` or `host:slots` in a comma-separated list."""
    nodes: list[tuple[str, int | None]] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, colon, count = item.partition(":")
        if colon and not (count.isdigit() and int(count) >= 1):
            raise SettingsError(
                f"{source}: {item!r} has no whole rank count of at least 1 after the colon: write {NODE_WITH_SLOTS}"
            )
        nodes.append((name, int(count) if colon else None))
    return nodes


HOSTFILE_LINE = re.compile(r"^(?P<host>\S+)(?:\s+slots=(?P<slots>\d+))?(?:\s+max_slots=\d+)?$")


def parse_hostfile(text: str, source: str) -> list[tuple[str, int | None]]:
    """(host, ranks or None) for each line of an Open MPI hostfile (`node_1 slots=4`; `#` comments, blank lines;
    max_slots, which a launch never exceeds anyway, is accepted and left aside)."""
    nodes: list[tuple[str, int | None]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = HOSTFILE_LINE.match(line)
        if not match or (match["slots"] is not None and int(match["slots"]) < 1):
            raise SettingsError(
                f"{source} line {number}: {raw.strip()!r} is not `HOST` or `HOST slots=N` with N >= 1 "
                "(Open MPI's hostfile format)"
            )
        nodes.append((match["host"], int(match["slots"]) if match["slots"] else None))
    if not nodes:
        raise SettingsError(f"{source} lists no host: write one `HOST slots=N` line per node")
    return nodes


def parse_gpus(text: str, source: str = "--gpus") -> tuple[int, tuple[str, ...]]:
    """The GPUs each worker gets, as (count, IDs): `2` is a count (any two GPUs of the node); `0,1`, `device=1` or
    `GPU-<uuid>,...` name them (IDs empty for a count). As Docker's `--gpus`, a bare number is a count."""
    value = text.strip()
    if value.isdigit():
        return int(value), ()
    ids = tuple(item.strip() for item in value.removeprefix("device=").split(","))
    if not all(GPU_ID.match(item) for item in ids) or len(set(ids)) != len(ids):
        raise SettingsError(f"{source} {text!r} is neither a GPU count nor distinct GPU IDs: {GPUS_FIX}")
    return len(ids), ids


def engine_override_key(node: str) -> str:
    """The .env key that overrides how NODE's engine is reached, e.g. DOCKER_HOST_NODE_2 for node_2."""
    return "DOCKER_HOST_" + re.sub(r"[^A-Za-z0-9]", "_", node).upper()


@dataclass(frozen=True)
class LaunchSettings:
    nodes: tuple[str, ...]
    """Hosts to run on, rank 0 first. Each must resolve to its host on every node."""
    slots: int = 1
    """Ranks per node (CPU) for nodes without a count of their own."""
    node_slots: dict[str, int] = field(default_factory=dict)
    """Nodes' own rank counts (--nodes HOST:SLOTS, --hostfile); with GPUs, each such node's GPUs."""
    gpus_per_node: int = 0
    """Ranks per node, one GPU each through the NVIDIA Container Toolkit; replaces slots when set."""
    gpu_ids: tuple[str, ...] = ()
    """The GPUs each worker gets, by index or UUID (--gpus 0,1); empty: any gpus_per_node of the node's."""
    image: str = "horovod-stack:latest"
    ssh_port: int = SSH_PORT
    network_interface: str | None = None
    """A NIC every node has (workers use host networking), for Open MPI, NCCL and Gloo; None: each chooses."""
    shared_dir: str = "horovod-stack-shared"
    """Mounted at /shared in every worker: a volume name (default; one per node) or a host folder, such as the
    same NFS mount on every node, writable by uid 1000."""
    shm_size: str = "1g"
    ready_timeout: float = READY_TIMEOUT_SECONDS
    """How long the job agent waits for every worker's sshd to answer."""
    engines: dict[str, str] = field(default_factory=dict)
    """Per-node engine address overrides (tcp://, unix://, ssh://USER@HOST); default ssh://NODE."""
    command: tuple[str, ...] = TRAINER
    """What every rank runs (plan.job_command of the words after `--`)."""
    env: tuple[str, ...] = ()
    """KEY=VALUE pairs for every rank (--env, repeatable)."""
    workdir: Path | None = None
    """A local folder copied to /workdir in every worker container, the command's working directory."""
    elastic_min_nodes: int | None = None
    """Elastic training (--elastic): the job goes on while at least this many nodes' workers remain."""
    elastic_max_nodes: int | None = None
    """Elastic: the most nodes that train at once (default: all of --nodes)."""
    elastic_timeout: int = ELASTIC_TIMEOUT_SECONDS
    """Elastic: seconds the job waits below the minimum for workers to come back before it fails."""
    restart_workers: bool = False
    """Elastic: the launcher starts a node's worker again when it stops; it rejoins at the next discovery."""
    devices: tuple[str, ...] = ()
    """Host devices for every worker, HOST_PATH[:CONTAINER_PATH] (e.g. /dev/infiniband for RDMA)."""
    binds: tuple[Bind, ...] = ()
    """Host folders every worker gets (--mount HOST_PATH:CONTAINER_PATH[:ro]; MOUNTS in .env)."""
    stall_timeout: int = STALL_TIMEOUT_SECONDS
    """Seconds without output or new metrics after which the job agent calls the job stalled (0: never)."""
    stall_action: str = STALL_ACTIONS[0]
    """warn (gather the stacks, record the stall) or fail (also end the job)."""

    def __post_init__(self) -> None:
        if not self.nodes:
            raise SettingsError("no nodes given: pass --nodes node_1,node_2")
        for node in self.nodes:
            if not NODE_NAME.match(node):
                raise SettingsError(f"node name {node!r} is not a host name: pass --nodes with names like node_1")
        duplicates = sorted({node for node in self.nodes if self.nodes.count(node) > 1})
        if duplicates:
            raise SettingsError(
                f"node {duplicates[0]} is listed twice: list each host once, with its rank count "
                f"({duplicates[0]}:4) for more ranks there"
            )
        if sorted(set(self.node_slots) - set(self.nodes)) or min(self.node_slots.values(), default=1) < 1:
            raise SettingsError(f"every node's own rank count needs a listed node and at least 1: {NODE_WITH_SLOTS}")
        if self.gpu_ids and any(count != len(self.gpu_ids) for count in self.node_slots.values()):
            raise SettingsError(
                f"--gpus names {len(self.gpu_ids)} GPU(s) for every node, but a node's count differs: give per-node "
                "counts with --gpus N (any N of each node's GPUs), or drop the counts"
            )
        if "/" in (self.network_interface or ""):
            try:
                subnet = ipaddress.IPv4Network(self.network_interface or "", strict=False)
            except ValueError:
                raise SettingsError(
                    f"--network-interface {self.network_interface!r} is neither a NIC name nor an IPv4 subnet in "
                    "CIDR form: pass e.g. eth0 or 10.0.0.0/24"
                ) from None
            object.__setattr__(self, "network_interface", str(subnet))
        if self.slots < 1:
            raise SettingsError(f"--slots must be at least 1 (got {self.slots})")
        if self.gpus_per_node < 0:
            raise SettingsError(f"--gpus must be 0 or more (got {self.gpus_per_node}): {GPUS_FIX}")
        if self.gpu_ids and len(self.gpu_ids) != self.gpus_per_node:
            raise SettingsError(f"--gpus names {len(self.gpu_ids)} GPU(s) for {self.gpus_per_node} ranks: {GPUS_FIX}")
        if not 1 <= self.ssh_port <= 65535:
            raise SettingsError(f"--ssh-port must be a TCP port, 1-65535 (got {self.ssh_port})")
        if self.stall_timeout < 0:
            raise SettingsError(f"--stall-timeout must be 0 (off) or positive seconds (got {self.stall_timeout})")
        if self.stall_action not in STALL_ACTIONS:
            raise SettingsError(
                f"--stall-action {self.stall_action!r} is not one of {', '.join(STALL_ACTIONS)}: pass one of them"
            )
        if self.ready_timeout <= 0:
            raise SettingsError(f"READY_TIMEOUT must be positive seconds (got {self.ready_timeout})")
        for item in self.env:
            try:
                check_env_assignment(item)
            except ValueError as error:
                raise SettingsError(str(error)) from None
        for device in self.devices:
            if not all(part.startswith("/dev/") for part in device.split(":")[:2]):
                raise SettingsError(
                    f"--device {device!r} is not HOST_PATH[:CONTAINER_PATH] under /dev: pass e.g. "
                    "--device /dev/infiniband"
                )
        if self.workdir is not None:
            if not self.workdir.is_dir():
                raise SettingsError(
                    f"--workdir {self.workdir} is not a folder here: pass the folder that holds your training code"
                )
            size = payload_bytes(self.workdir)
            if size > WORKDIR_LIMIT_BYTES:
                raise SettingsError(
                    f"--workdir {self.workdir} holds {size / 1024**2:.0f} MB, more than the "
                    f"{WORKDIR_LIMIT_BYTES // 1024**2} MB copied to every node: put data in SHARED_DIR, or bake "
                    "the code into an image FROM horovod-stack:latest (README)"
                )
        self._check_elastic()
        unknown = sorted(set(self.engines) - set(self.nodes))
        if unknown:
            raise SettingsError(f"an engine override names {unknown[0]!r}, which is not in --nodes")

    def _check_elastic(self) -> None:
        count = len(self.nodes)
        if self.elastic_min_nodes is None:
            if self.elastic_max_nodes is not None or self.restart_workers:
                raise SettingsError("--max-nodes and --restart-workers are for elastic jobs: add --elastic")
            return
        if not 1 <= self.elastic_min_nodes <= count:
            raise SettingsError(
                f"--min-nodes must be from 1 to the {count} node(s) in --nodes (got {self.elastic_min_nodes})"
            )
        if self.elastic_max_nodes is not None and not self.elastic_min_nodes <= self.elastic_max_nodes <= count:
            raise SettingsError(
                f"--max-nodes must be from --min-nodes ({self.elastic_min_nodes}) to the {count} "
                f"node(s) in --nodes (got {self.elastic_max_nodes})"
            )
        if self.elastic_timeout <= 0:
            raise SettingsError(f"ELASTIC_TIMEOUT must be positive seconds (got {self.elastic_timeout})")
        if not self.network_interface:
            raise SettingsError(
                "--elastic needs the NIC the nodes reach each other on: pass --network-interface "
                "(e.g. eth0; `ip -br addr` on a node lists them)"
            )

    def engine_url(self, node: str) -> str:
        return self.engines.get(node) or f"ssh://{node}"

    def plan(self, cluster_id: str | None = None) -> ClusterPlan:
        cluster_id = cluster_id or secrets.token_hex(4)
        return ClusterPlan(
            cluster_id=cluster_id,
            nodes=tuple(Node(name, self.engine_url(name), self.node_slots.get(name)) for name in self.nodes),
            image=self.image,
            slots_per_node=self.gpus_per_node or self.slots,
            gpus_per_node=self.gpus_per_node,
            gpu_ids=self.gpu_ids,
            ssh_port=self.ssh_port,
            network_interface=self.network_interface,
            shared_dir=self.shared_dir,
            shm_size=self.shm_size,
            command=tuple(with_run_dir(self.command, run_dir(cluster_id))),
            env=self.env,
            devices=self.devices,
            workdir=str(self.workdir) if self.workdir else None,
            elastic_min_nodes=self.elastic_min_nodes,
            elastic_max_nodes=self.elastic_max_nodes,
            elastic_timeout=self.elastic_timeout,
            ready_timeout=self.ready_timeout,
            stall_timeout=self.stall_timeout,
            stall_action=self.stall_action,
            binds=self.binds,
        )


def _as_int(values: dict, key: str, flag: str) -> int | None:
    raw = values.get(key)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"{key}={raw!r} in the .env file is not a whole number: fix it or pass {flag}") from None


def split_list(text: str) -> tuple[str, ...]:
    """A comma-separated .env value's items."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def load_env_file(path: Path | None) -> dict[str, str]:
    """The .env file's values; a missing default file is empty, a missing named file is an error."""
    if path is None:
        path = Path(".env")
        if not path.exists():
            return {}
    if not path.is_file():
        raise SettingsError(f"env file {path} does not exist: pass --env-file with an existing file")
    return {key: value for key, value in dotenv_values(path).items() if value is not None}


def resolve_settings(
    env: dict[str, str],
    *,
    nodes: str | None,
    hostfile: Path | None = None,
    slots: int | None = None,
    gpus: str | None = None,
    image: str | None = None,
    ssh_port: int | None = None,
    network_interface: str | None = None,
    command: tuple[str, ...] = TRAINER,
    env_vars: tuple[str, ...] = (),
    workdir: Path | None = None,
    elastic_min_nodes: int | None = None,
    elastic_max_nodes: int | None = None,
    restart_workers: bool = False,
    devices: tuple[str, ...] = (),
    stall_timeout: int | None = None,
    stall_action: str | None = None,
    mounts: tuple[str, ...] = (),
) -> LaunchSettings:
    """Flags win over the .env file, which wins over the defaults. Compose's keys (NETWORK_INTERFACE, WORKERS, ...)
    are not read: they describe compose's containers, not the nodes."""
    if hostfile is not None and nodes:
        raise SettingsError("--hostfile and --nodes both list the nodes: pass one of them")
    if hostfile is not None:
        if not hostfile.is_file():
            raise SettingsError(f"--hostfile {hostfile} does not exist: pass an Open MPI hostfile (node_1 slots=4)")
        listed = parse_hostfile(hostfile.read_text(), f"--hostfile {hostfile}")
    else:
        listed = parse_node_list(nodes or env.get("NODES", ""), "--nodes" if nodes else "NODES in .env")
    node_list = tuple(name for name, _ in listed)
    chosen: dict[str, Any] = {
        "slots": slots if slots is not None else _as_int(env, "SLOTS_PER_WORKER", "--slots"),
        "image": image or env.get("IMAGE"),
        "ssh_port": ssh_port if ssh_port is not None else _as_int(env, "SSH_PORT", "--ssh-port"),
        "network_interface": network_interface or env.get(NIC_SETTING) or None,
        "shared_dir": env.get("SHARED_DIR"),
        "shm_size": env.get("SHM_SIZE"),
        "ready_timeout": _as_int(env, "READY_TIMEOUT", "READY_TIMEOUT in .env"),
        "elastic_timeout": _as_int(env, "ELASTIC_TIMEOUT", "ELASTIC_TIMEOUT in .env"),
        "stall_timeout": stall_timeout
        if stall_timeout is not None
        else _as_int(env, "STALL_TIMEOUT", "--stall-timeout"),
        "stall_action": stall_action or env.get("STALL_ACTION") or None,
    }
    if gpus is not None:
        chosen["gpus_per_node"], chosen["gpu_ids"] = parse_gpus(gpus)
    elif env.get("GPUS_PER_NODE", "").strip():
        chosen["gpus_per_node"], chosen["gpu_ids"] = parse_gpus(env["GPUS_PER_NODE"], "GPUS_PER_NODE in .env")
    try:
        binds = tuple(parse_bind(item) for item in mounts or split_list(env.get("MOUNTS", "")))
    except ValueError as error:
        raise SettingsError(str(error)) from None
    engines = {node: env[engine_override_key(node)] for node in node_list if env.get(engine_override_key(node))}
    return LaunchSettings(
        nodes=node_list,
        node_slots={name: count for name, count in listed if count is not None},
        engines=engines,
        command=tuple(command),
        env=tuple(env_vars),
        workdir=workdir,
        elastic_min_nodes=elastic_min_nodes,
        elastic_max_nodes=elastic_max_nodes,
        restart_workers=restart_workers,
        devices=devices or split_list(env.get("DEVICES", "")),
        binds=binds,
        **{key: value for key, value in chosen.items() if value is not None},
    )
