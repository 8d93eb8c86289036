"""Where and how the multi-host launcher runs a job: the nodes, their GPUs, the image, the shared folder, plus the
job's own options (launcher.core.options.JobOptions). Read from a .env file (python-dotenv), overridden by flags,
validated at construction: every error names the setting and the fix, so a bad value stops the launcher before it
touches any node.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from dotenv import dotenv_values

from launcher.core.imageref import ImageRef, parse_image
from launcher.core.options import SWITCH_WORDS, JobOptions, SettingsError, option_kind
from launcher.core.protocol import DEFAULT_IMAGE, SHARED_VOLUME, SHM_SIZE
from launcher.core.ranks import LAUNCHER, parse_ranks, ranks_per_node
from launcher.host.planning import access
from launcher.host.planning.access import CONNECT_TIMEOUT_S, EngineTls, engine_override_key
from launcher.host.planning.flags import FLAGS
from launcher.host.planning.workdir import IgnoreFileError, payload_bytes

NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

GPU_ID = re.compile(r"(\d+|GPU-[0-9A-Fa-f-]+|MIG-[0-9A-Za-z/-]+)")
"""A GPU as Docker's device request and nvidia-smi name it: an index, or a GPU's or MIG instance's UUID."""
GPUS_FIX = "pass a count (--gpus 2) or GPU IDs (--gpus 0,1; one GPU by ID: --gpus device=1)"

WORKDIR_LIMIT_BYTES = 256 * 1024**2
"""--workdir copies through the Docker API to every node; past this a derived image or a shared folder is the way."""


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


HOSTFILE_LINE = re.compile(r"(?P<host>\S+)(?:\s+slots=(?P<slots>\d+))?(?:\s+max_slots=\d+)?")


def parse_hostfile(text: str, source: str) -> list[tuple[str, int | None]]:
    """(host, ranks or None) for each line of an Open MPI hostfile (`node_1 slots=4`; `#` comments, blank lines;
    max_slots, which a launch never exceeds anyway, is accepted and left aside)."""
    nodes: list[tuple[str, int | None]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = HOSTFILE_LINE.fullmatch(line)
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
    if not all(GPU_ID.fullmatch(item) for item in ids) or len(set(ids)) != len(ids):
        raise SettingsError(f"{source} {text!r} is neither a GPU count nor distinct GPU IDs: {GPUS_FIX}")
    return len(ids), ids


@dataclass(frozen=True)
class LaunchSettings:
    nodes: tuple[str, ...]
    """Hosts to run on, rank 0 first. Each must resolve to its host on every node."""
    spares: tuple[str, ...] = ()
    """Hosts kept in reserve (--spares, SPARES; with job.max_restarts): each gets a worker, started and checked as
    the nodes' are, out of the hostfile until a restart puts it in a lost node's place."""
    job: JobOptions = field(default_factory=JobOptions)
    """What runs there: the command, its environment, the NIC, the port, the timeouts, the elastic settings."""
    slots: int | None = None
    """Ranks per node for nodes without a count of their own, as given (--slots, SLOTS_PER_WORKER); None: not given.
    The ranks themselves are ranks_per_node's."""
    node_slots: dict[str, int] = field(default_factory=dict)
    """Nodes' own rank counts (--nodes HOST:SLOTS, --hostfile); with GPUs, each such node's GPUs."""
    gpus_per_node: int = 0
    """GPUs per node, one rank each, through the NVIDIA Container Toolkit (core/ranks.py: slots given must agree)."""
    gpu_ids: tuple[str, ...] = ()
    """The GPUs each worker gets, by index or UUID (--gpus 0,1); empty: any gpus_per_node of the node's."""
    image: str = DEFAULT_IMAGE
    image_ref: ImageRef = field(init=False, repr=False, compare=False, default=parse_image(DEFAULT_IMAGE))
    """The image's name read once, at construction (its registry, whether a start pulls it)."""
    shared_dir: str = SHARED_VOLUME
    """Mounted at /shared in every worker: a volume name (default; one per node) or a host folder, such as the
    same NFS mount on every node, writable by uid 1000."""
    shm_size: str = SHM_SIZE
    engines: dict[str, str] = field(default_factory=dict)
    """Per-node engine address overrides (tcp://, unix://, ssh://USER@HOST); default ssh://NODE."""
    engine_tls: dict[str, EngineTls] = field(default_factory=dict)
    """Per-node TLS of tcp:// engines, the Docker CLI's variables (launcher.host.planning.access); a node without: none
    set."""
    insecure_engines: bool = False
    """Engines others could read (plain tcp:// off this machine) are allowed (--insecure-engine, INSECURE_ENGINES)."""
    devices: tuple[str, ...] = ()
    """Host devices for every worker, HOST_PATH[:CONTAINER_PATH] (e.g. /dev/infiniband for RDMA)."""
    push_image: bool = False
    """Copy the image from this machine's engine to the nodes that lack it."""
    detach: bool = False
    """Return once the job runs; the job ends by itself in the cluster."""
    keep_running: bool = False
    """The workers stay up after the job (with detach) until `launcher stop`."""
    shown_ranks: frozenset[int] | None = None
    """The ranks whose lines an attached start shows (--ranks), beside the job agent's own; None: the whole output.
    The job's log in rank 0's container keeps every line either way."""
    connect_timeout: float = CONNECT_TIMEOUT_S
    """Seconds reaching a node's engine may take before the launcher gives up on it (CONNECT_TIMEOUT in .env)."""
    secret_values: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    """The values of the job's secret settings (job.secrets), by name: handed to rank 0's container as a 0600 file
    at start, never shown."""

    def __post_init__(self) -> None:
        if not self.nodes:
            raise SettingsError("no nodes given: pass --nodes node_1,node_2")
        for node in self.nodes:
            if not NODE_NAME.fullmatch(node):
                raise SettingsError(f"node name {node!r} is not a host name: pass --nodes with names like node_1")
        duplicates = sorted({node for node in self.nodes if self.nodes.count(node) > 1})
        if duplicates:
            raise SettingsError(
                f"node {duplicates[0]} is listed twice: list each host once, with its rank count "
                f"({duplicates[0]}:4) for more ranks there"
            )
        self._check_spares()
        if sorted(set(self.node_slots) - set(self.all_nodes)) or min(self.node_slots.values(), default=1) < 1:
            raise SettingsError(f"every node's own rank count needs a listed node and at least 1: {NODE_WITH_SLOTS}")
        if self.gpu_ids and any(count != len(self.gpu_ids) for count in self.node_slots.values()):
            raise SettingsError(
                f"--gpus names {len(self.gpu_ids)} GPU(s) for every node, but a node's count differs: give per-node "
                "counts with --gpus N (any N of each node's GPUs), or drop the counts"
            )
        if not self.connect_timeout > 0:
            raise SettingsError(
                f"CONNECT_TIMEOUT in .env must be a positive number of seconds (got {self.connect_timeout})"
            )
        ranks_per_node(self.slots, self.gpus_per_node, LAUNCHER)
        if self.gpu_ids and len(self.gpu_ids) != self.gpus_per_node:
            raise SettingsError(f"--gpus names {len(self.gpu_ids)} GPU(s) for {self.gpus_per_node} ranks: {GPUS_FIX}")
        for device in self.devices:
            if not all(part.startswith("/dev/") for part in device.split(":")[:2]):
                raise SettingsError(
                    f"--device {device!r} is not HOST_PATH[:CONTAINER_PATH] under /dev: pass e.g. "
                    "--device /dev/infiniband"
                )
        try:
            object.__setattr__(self, "image_ref", parse_image(self.image))
        except ValueError as error:
            raise SettingsError(
                f"image {self.image!r} (--image, IMAGE in .env) is not an image name: {error}"
            ) from None
        unknown = sorted(set(self.engines) - set(self.all_nodes))
        if unknown:
            raise SettingsError(f"an engine override names {unknown[0]!r}, which is not in --nodes")
        for node in self.all_nodes:
            self._check_engine(node)
        missing = [name for name in self.job.secrets if name not in self.secret_values]
        if missing:
            raise SettingsError(
                f"--secret {missing[0]}: {missing[0]} is set neither in this machine's environment nor in .env: "
                f"export {missing[0]}=... or add it to .env"
            )
        problem = self.job.workers_problem(len(self.nodes))
        if problem:
            raise SettingsError(problem)
        if self.job.workdir is not None:
            self._check_workdir(Path(self.job.workdir))
        most = sum(self.ranks_on(node) for node in self.all_nodes)
        if self.shown_ranks and max(self.shown_ranks) >= most:
            raise SettingsError(
                f"--ranks names rank {max(self.shown_ranks)}, but the job has at most {most} ranks: pass ranks from 0 "
                f"to {most - 1}"
            )

    @property
    def all_nodes(self) -> tuple[str, ...]:
        """Every host that gets a worker: the nodes, rank 0 first, then the spares."""
        return (*self.nodes, *self.spares)

    def _check_spares(self) -> None:
        for spare in self.spares:
            if not NODE_NAME.fullmatch(spare):
                raise SettingsError(f"spare {spare!r} is not a host name: pass --spares with names like node_4")
        listed = [spare for spare in self.spares if spare in self.nodes or self.spares.count(spare) > 1]
        if listed:
            raise SettingsError(
                f"spare {listed[0]} is listed twice (in --nodes or --spares): list each host once, in one of them"
            )
        if self.spares and not self.job.can_restart:
            raise SettingsError(
                "--spares stand in for a lost node when the job restarts: add --max-restarts N (MAX_RESTARTS in .env)"
            )

    @property
    def ranks_per_node(self) -> int:
        """Ranks on a node without a count of its own: one per GPU, else the slots, else 1 (core/ranks.py)."""
        return ranks_per_node(self.slots, self.gpus_per_node, LAUNCHER)

    def ranks_on(self, node: str) -> int:
        """The ranks `node` runs: its own count (node:RANKS, a hostfile's slots), else ranks_per_node."""
        return self.node_slots.get(node, self.ranks_per_node)

    @staticmethod
    def _check_workdir(folder: Path) -> None:
        """This machine's code folder, which the launcher copies to every node (compose mounts its own)."""
        if not folder.is_dir():
            raise SettingsError(
                f"--workdir {folder} is not a folder here: pass the folder that holds your training code"
            )
        try:
            size = payload_bytes(folder)
        except IgnoreFileError as error:
            raise SettingsError(f"--workdir {folder}: {error}") from None
        if size > WORKDIR_LIMIT_BYTES:
            raise SettingsError(
                f"--workdir {folder} holds {size / 1024**2:.0f} MB, more than the "
                f"{WORKDIR_LIMIT_BYTES // 1024**2} MB copied to every node: put data in SHARED_DIR, or bake "
                "the code into an image FROM horovod-stack:latest (docs/compose.md, Running jobs)"
            )

    def _check_engine(self, node: str) -> None:
        """The node's engine as the launcher will reach it (launcher.host.planning.access): TLS files there, and an
        engine others could read only where allowed."""
        url, tls = self.engine_url(node), self.engine_tls.get(node)
        problem = access.misplaced(node, url, tls) if tls else None
        if problem:
            raise SettingsError(problem)
        why = access.exposure(url, access.tls_config(node, url, tls))
        if why and not self.insecure_engines:
            raise SettingsError(access.refusal(node, url, why))

    def engine_url(self, node: str) -> str:
        return self.engines.get(node) or f"ssh://{node}"

    def exposed_engines(self) -> dict[str, tuple[str, str]]:
        """{node: (engine URL, why)} for the engines others could read (allowed by insecure_engines)."""
        exposed = {}
        for node in self.all_nodes:
            url = self.engine_url(node)
            why = access.exposure(url, access.tls_config(node, url, self.engine_tls.get(node)))
            if why:
                exposed[node] = (url, why)
        return exposed


def _as_number(values: Mapping[str, str], key: str, fix: str, kind: type[int] | type[float] = int) -> Any:
    """The .env key's value as a whole number (kind int) or any number (float); None where it is empty."""
    raw = values.get(key)
    if raw in (None, ""):
        return None
    try:
        return kind(raw)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise SettingsError(f"{key}={raw!r} in the .env file is not {what}: {fix}") from None


def as_bool(key: str, raw: str, fix: str) -> bool:
    """A yes/no .env value, in the words every launch method takes (options.SWITCH_WORDS)."""
    value = SWITCH_WORDS.get(raw.strip().lower())
    if value is None:
        raise SettingsError(f"{key}={raw!r} in the .env file is not 1 or 0 (true or false): {fix}")
    return value


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


def job_options(env: Mapping[str, str], flags: Mapping[str, Any]) -> JobOptions:
    """The job's options: each flag given (not None, not empty) wins over its .env key (option's `key`), which wins
    over the default. A key whose option a flag sets is not read. Compose's keys (NETWORK_INTERFACE, WORKERS, ...)
    are not read either: they describe compose's containers, not the nodes."""
    chosen: dict[str, Any] = {name: value for name, value in flags.items() if value not in (None, (), "")}
    for item in fields(JobOptions):
        key = item.metadata.get("key")
        raw = env.get(key, "").strip() if key else ""
        if not key or not raw or item.name in chosen:
            continue
        kind = option_kind(item.name)
        flag = item.metadata.get("flag")
        fix = f"fix it or pass {flag}" if flag else "fix it"
        if kind in (int, float):
            chosen[item.name] = _as_number(env, key, fix, kind)
        elif kind is bool:
            chosen[item.name] = as_bool(key, raw, fix)
        else:
            chosen[item.name] = split_list(raw) if kind is tuple else raw
    return JobOptions(**chosen)


KEYS = {row.name: row.key for row in FLAGS if row.key}
"""Each flag's .env key, as `launcher start`'s table of flags (launcher/host/planning/flags.py) declares it."""


def resolve_settings(
    env: Mapping[str, str],
    *,
    nodes: str | None = None,
    hostfile: Path | None = None,
    job: Mapping[str, Any] | None = None,
    spares: str | None = None,
    slots: int | None = None,
    gpus: str | None = None,
    image: str | None = None,
    devices: tuple[str, ...] = (),
    push_image: bool = False,
    detach: bool = False,
    keep_running: bool = False,
    ranks: str | None = None,
    insecure_engines: bool = False,
    environ: Mapping[str, str] | None = None,
) -> LaunchSettings:
    """Flags win over the .env file, which wins over the defaults. `job` holds the job options' flags, by their
    JobOptions names (None: not given). A secret setting's value, and the engines' keys (DOCKER_HOST_<NODE>, the TLS
    variables, INSECURE_ENGINES: launcher.host.planning.access), come from `environ` (this process's environment by
    default), else from the .env file."""
    if hostfile is not None and nodes:
        raise SettingsError("--hostfile and --nodes both list the nodes: pass one of them")
    if hostfile is not None:
        if not hostfile.is_file():
            raise SettingsError(f"--hostfile {hostfile} does not exist: pass an Open MPI hostfile (node_1 slots=4)")
        listed = parse_hostfile(hostfile.read_text(), f"--hostfile {hostfile}")
    else:
        listed = parse_node_list(
            nodes or env.get(KEYS["nodes"], ""), "--nodes" if nodes else f"{KEYS['nodes']} in .env"
        )
    node_list = tuple(name for name, _ in listed)
    spare_list = parse_node_list(
        spares or env.get(KEYS["spares"], ""), "--spares" if spares else f"{KEYS['spares']} in .env"
    )
    listed = [*listed, *spare_list]
    chosen: dict[str, Any] = {
        "slots": slots if slots is not None else _as_number(env, KEYS["slots"], "fix it or pass --slots"),
        "image": image or env.get(KEYS["image"]),
        "shared_dir": env.get("SHARED_DIR"),
        "shm_size": env.get("SHM_SIZE"),
        "connect_timeout": _as_number(env, "CONNECT_TIMEOUT", "give seconds, e.g. CONNECT_TIMEOUT=10", float),
    }
    if gpus is not None:
        chosen["gpus_per_node"], chosen["gpu_ids"] = parse_gpus(gpus)
    elif env.get(KEYS["gpus"], "").strip():
        chosen["gpus_per_node"], chosen["gpu_ids"] = parse_gpus(env[KEYS["gpus"]], f"{KEYS['gpus']} in .env")
    environ = os.environ if environ is None else environ
    keys = {**env, **environ}
    every_node = tuple(name for name, _ in listed)
    engines = {node: keys[engine_override_key(node)] for node in every_node if keys.get(engine_override_key(node))}
    tls = {node: access.EngineTls.of(keys, node) for node in every_node}
    options = job_options(env, job or {})
    secrets = {name: value for name in options.secrets if (value := environ.get(name, env.get(name)))}
    return LaunchSettings(
        nodes=node_list,
        spares=tuple(name for name, _ in spare_list),
        job=options,
        secret_values=secrets,
        node_slots={name: count for name, count in listed if count is not None},
        engines=engines,
        engine_tls={node: found for node, found in tls.items() if found.verify or found.cert_path},
        insecure_engines=access.insecure_allowed(keys, insecure_engines),
        devices=devices or split_list(env.get(KEYS["device"], "")),
        push_image=push_image,
        detach=detach,
        keep_running=keep_running,
        shown_ranks=None if ranks is None else parse_ranks(ranks),
        **{key: value for key, value in chosen.items() if value is not None},
    )


def read_settings(env_file: Path | None, **flags: Any) -> tuple[LaunchSettings, str | None]:
    """A command's settings from the .env file (`env_file`, else ./.env), the environment and its flags
    (resolve_settings's keyword arguments), and the one warning it gives where --insecure-engine allowed engines
    others could read (None where it allowed none); raises SettingsError on a bad setting."""
    settings = resolve_settings(load_env_file(env_file), **flags)
    return settings, access.warning(settings.exposed_engines())
