"""One node's Docker engine, as the host side sees it: the NodeEngine protocol (what launch, preflight, doctor, status,
logs, stacks and results ask of a node), the records it answers in (a Container, a worker's Loss) and the one error it
raises (a NodeError: what happened, as a Failure; the node; one line with the fix). Its Docker SDK implementation is
NodeDriver (launcher/host/engines/docker_driver.py), the only code that touches a docker-py object; tests use a stand-in
of NodeEngine (tests/standins.py). The order of a launch lives in launch.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, TypeVar

from app.gpu import CudaBuild
from launcher.core.imageref import parse_image
from launcher.core.mounts import Bind
from launcher.host.planning.plan import GpuRequest, Node, WorkerContainer
from launcher.host.planning.preflight import HostView

Each = TypeVar("Each")
Result = TypeVar("Result")


def on_each(nodes: Sequence[Each], work: Callable[[Each], Result]) -> list[Result]:
    """`work` for every node at once (a node's engine, or what goes with it), the results in the nodes' order: N nodes
    cost about one. Once every node's work has ended, the first node's error (in that order) is raised."""
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        futures = [pool.submit(work, node) for node in nodes]
    return [future.result() for future in futures]


@dataclass(frozen=True)
class ContainerState:
    """A worker container's state as its engine reports it: running, or ended with its exit code and time."""

    node: str
    running: bool
    exit_code: int | None = None
    finished_at: str | None = None
    """Docker's RFC 3339 time, or None while running."""


class Failure(Enum):
    """What happened, for callers that act on it (never on a message's wording)."""

    UNREACHABLE = "unreachable"
    """The engine does not answer."""
    REFUSED = "refused"
    """The engine refused a request (a container that did not start, a write it would not take)."""
    NOT_FOUND = "not found"
    """What was asked for is not there (a container removed, an image missing)."""
    FAILED = "failed"
    """The request ran and failed (a copy, a pull, an export)."""


class NodeError(RuntimeError):
    """Something on one node stops the launch: `node`, what happened there with the fix (`detail`), and the kind of
    it (`failure`). Its message is "NODE: DETAIL"."""

    def __init__(self, node: str, detail: str, failure: Failure = Failure.FAILED) -> None:
        super().__init__(f"{node}: {detail}")
        self.node, self.detail, self.failure = node, detail, failure


@dataclass(frozen=True)
class Container:
    """One of the stack's containers on a node, as the engine last reported it."""

    id: str
    name: str
    labels: dict[str, str]
    status: str
    """Docker's word: created, running, exited, ..."""
    state: ContainerState

    @property
    def running(self) -> bool:
        return self.status == "running"


@dataclass(frozen=True)
class Loss:
    """Why a worker is lost: its container removed, or killed (docker kill, out of memory, a crash by signal)."""

    why: str
    removed: bool = False

    def __str__(self) -> str:
        return self.why


REMOVED = Loss("its worker container is gone (removed)", removed=True)


class NodeEngine(Protocol):
    """What the host side asks of one node's engine. Containers are named by ID; every failure is a NodeError."""

    node: Node

    def version(self) -> str: ...

    def host_name(self) -> str: ...

    def image_id(self, image: str) -> str | None: ...

    def cluster_containers(self, cluster_id: str | None = None) -> list[Container]: ...

    def clock_skew_seconds(self) -> float: ...

    def image_labels(self, image: str) -> dict[str, str]: ...

    def gpu_problem(self, image: str, gpu: GpuRequest, build: CudaBuild) -> str | None: ...

    def missing_bind(self, image: str, binds: tuple[Bind, ...]) -> str | None: ...

    def host_view(self, image: str, port: int, resolve: tuple[str, ...] = ()) -> HostView: ...

    def list_runs(self, image: str, shared_dir: str) -> list[tuple[str, int]]: ...

    def run_entries(self, image: str, shared_dir: str, name: str) -> list[str]: ...

    def run_archive(self, image: str, shared_dir: str, name: str) -> Iterator[bytes]: ...

    def start_probe(self, image: str, argv: list[str], name: str, labels: dict[str, str]) -> str: ...

    def wait_for_output(self, container_id: str, text: str, timeout: float) -> str | None: ...

    def finish(self, container_id: str, timeout: float) -> str: ...

    def image_size(self, image: str) -> int: ...

    def save_image(self, image: str) -> Iterator[bytes]: ...

    def image_layers(self, image: str) -> list[str]: ...

    def layer_chains(self) -> set[str]: ...

    def load_image(self, chunks: Iterator[bytes], image: str) -> None: ...

    def pull_image(self, image: str, progress: Callable[[int, int], None]) -> None: ...

    def start_worker(self, spec: WorkerContainer) -> Container: ...

    def put_files(self, container_id: str, path: str, archive: bytes) -> None: ...

    def read_file(self, container_id: str, path: str) -> str | None: ...

    def stream_file(self, container_id: str, path: str) -> Iterator[bytes] | None: ...

    def logs(self, container_id: str) -> Iterator[bytes]: ...

    def worker_problem(self, container_id: str) -> str | None: ...

    def lost_reason(self, container_id: str) -> Loss | None: ...

    def exec_stream(self, container_id: str, argv: list[str]) -> tuple[str, Iterator[bytes]]: ...

    def exec_detached(self, container_id: str, argv: list[str]) -> None: ...

    def exec_exit_code(self, exec_id: str) -> int | None: ...

    def remove_cluster(self, cluster_id: str | None = None) -> int: ...


Connect = Callable[[Node], NodeEngine]
"""How the host side reaches a node's engine (NodeDriver.connect; a stand-in in the tests)."""


def pull_failure(node: str, image: str, why: str) -> str:
    """What a pull that failed on `node` says (NodeError's detail), with the fix its cause calls for."""
    reference = parse_image(image)
    registry = reference.source
    login = f"docker login {reference.registry}" if reference.registry else "docker login"  # Docker Hub's: no host
    lowered = why.lower()
    if "no such host" in lowered or "connection refused" in lowered or "timeout" in lowered or "dial tcp" in lowered:
        fix = f"check that {registry} resolves and answers from {node} (plain HTTP: its engine's insecure-registries)"
    elif "unauthorized" in lowered or "denied" in lowered or "authentication" in lowered:
        fix = f"run `{login}` on this machine (the launcher sends its credentials)"
    elif "manifest unknown" in lowered or "not found" in lowered:
        fix = f"check the name and tag, or push the image there first (docker push {image})"
    else:
        fix = "pull it there by hand to see more, or pass --push-image to copy it from this machine"
    return f"pulling {image} failed ({why.splitlines()[0][:200]}); {fix}"


def connecting_line(node: Node) -> str:
    """What the launcher says as it reaches for a node's engine (before the bounded check: a node that hangs is
    named)."""
    return f"connecting to {node.name} ({node.engine_url})"
