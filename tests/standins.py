"""The stand-ins the unit tests use for the side effects: one of the host side's NodeEngine
(launcher/host/engines/node_engine.py) and one of the agent's Transport (launcher/agent/transport.py), with a clock, a
connection and records of what they were asked. Each refuses loudly what no unit test needs; mypy checks every method
each has against its protocol (the assignments under TYPE_CHECKING at the end), so a changed protocol fails the type
check, not a test at run time. The integration tests use the real things (Docker engines, sshd, mpirun) instead.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from app import gpu
from app.rank_error import RankError
from launcher.agent import stacks
from launcher.agent.rank_errors import RankErrors
from launcher.core import legacy_keras
from launcher.core.protocol import AGENT_LINK, HOSTKEYS_DIR, JOB_LOST, KNOWN_HOSTS
from launcher.host.engines.node_engine import (
    Connect,
    Container,
    ContainerState,
    Loss,
    NodeEngine,
    NodeError,
    pull_failure,
)
from launcher.host.planning.plan import Node, WorkerContainer
from launcher.host.planning.preflight import HostView

# --- the host side's engine -------------------------------------------------------------------------------------
IMAGE_ID = "sha256:0123456789abcdef"
"""The image's ID on a stand-in engine that has it, and after it pulls it."""


class PartialEngine:
    """A NodeEngine with only the methods a test defines on it: a call of any other fails loudly (AttributeError)
    rather than passing silently. A test's own small stand-in subclasses it, so it is a NodeEngine to mypy."""

    node: Node

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"{type(self).__name__} has no {name}")


class StandInEngine(PartialEngine):
    """One node's engine without Docker: what host_view, the GPU query, the link probe and the image's export give is
    given; starting a worker fails the test (every test of the host side that uses it expects the checks to refuse
    first)."""

    def __init__(
        self,
        name: str,
        nics: tuple[str, ...] = ("lo",),
        port_taken: bool = False,
        gpu_query: str = "",
        addresses: tuple[tuple[str, str], ...] = (),
        resolves: dict[str, str] | None = None,
        probe_output: str = "",
        interrupt: bool = False,
        chunks: list[bytes] | tuple[bytes, ...] = (),
        fail_after: int | None = None,
        image: str | None = IMAGE_ID,
        host_name: str | None = None,
        layers: tuple[str, ...] = (),
        chains: frozenset[str] = frozenset(),
        labels: dict[str, str] | None = None,
    ) -> None:
        self.node = Node(name, f"ssh://{name}")
        self.reported_host_name = host_name or name.replace("_", "-")
        """What the engine reports as the node's host name (servers cloned from one image share one)."""
        self.image = image
        """The image's ID on this node; None: it lacks the image."""
        self.labels = labels or {}
        """The image's labels (app/gpu.py FRAMEWORK_LABEL: which framework's GPU needs its nodes are held to)."""
        self.chunks, self.fail_after = list(chunks), fail_after
        """The image as this engine's export streams it; a load fails after `fail_after` chunks."""
        self.layers, self.chains = list(layers), set(chains)
        """The exported image's layers (diff IDs); the chain IDs of the layers this engine holds."""
        self.loaded: list[bytes] = []
        self.pulled: list[str] = []
        self.saves = 0
        self.view = HostView(port_taken=port_taken, nics=nics, addresses=addresses)
        self.resolves = resolves or {}
        self.gpu_query, self.probe_output, self.interrupt = gpu_query, probe_output, interrupt
        self.started: list[WorkerContainer] = []
        self.gpu_requests: list = []
        self.probes: list[tuple[list[str], dict[str, str]]] = []
        self.removed: list[str | None] = []

    def version(self) -> str:
        return "26.1.5"

    def host_name(self) -> str:
        return self.reported_host_name

    def image_id(self, image: str) -> str | None:
        return self.image

    def cluster_containers(self, cluster_id: str | None = None) -> list[Container]:
        return []

    def clock_skew_seconds(self) -> float:
        return 0.0

    def host_view(self, image: str, port: int, resolve: tuple[str, ...] = ()) -> HostView:
        # As /etc/hosts on every node would: the names given resolve, other names do not.
        resolved = tuple((name, self.resolves[name]) for name in resolve if name in self.resolves)
        return dataclasses.replace(self.view, resolved=resolved)

    def image_labels(self, image: str) -> dict[str, str]:
        return self.labels

    def gpu_problem(self, image: str, request, build: gpu.CudaBuild) -> str | None:
        self.gpu_requests.append(request)
        return gpu.gpu_problem(self.gpu_query, len(request.device_ids) or request.count, build)

    def missing_bind(self, image: str, binds) -> str | None:
        return None

    def start_worker(self, spec: WorkerContainer) -> Container:
        self.started.append(spec)
        raise AssertionError("a worker started")

    def start_probe(self, image: str, argv: list[str], name: str, labels: dict[str, str]) -> str:
        self.probes.append((argv, labels))
        return name

    def wait_for_output(self, container_id: str, text: str, timeout: float) -> str | None:
        return '{"listening": "x"}\n'

    def finish(self, container_id: str, timeout: float) -> str:
        if self.interrupt:
            raise KeyboardInterrupt
        return self.probe_output

    def remove_cluster(self, cluster_id: str | None = None) -> int:
        self.removed.append(cluster_id)
        return 1

    def lost_reason(self, container_id: str) -> Loss | None:
        return None

    def image_size(self, image: str) -> int:
        return sum(map(len, self.chunks))

    def save_image(self, image: str) -> Iterator[bytes]:
        self.saves += 1
        yield from self.chunks

    def image_layers(self, image: str) -> list[str]:
        return self.layers

    def layer_chains(self) -> set[str]:
        return self.chains

    def load_image(self, chunks: Iterator[bytes], image: str) -> None:
        for index, chunk in enumerate(chunks):
            if self.fail_after is not None and index >= self.fail_after:
                raise NodeError(self.node.name, f"copying {image} failed (no space left on device)")
            self.loaded.append(chunk)
        self.image = IMAGE_ID

    def pull_image(self, image: str, progress) -> None:
        if "missing" in image:
            raise NodeError(self.node.name, pull_failure(self.node.name, image, "manifest unknown"))
        progress(5, 10)
        progress(10, 10)
        self.pulled.append(image)
        self.image = IMAGE_ID


def connect_to(*engines: StandInEngine) -> Connect:
    """A `connect` for session and doctor that hands out the stand-ins by node name."""
    by_name = {engine.node.name: engine for engine in engines}

    def connect(node: Node) -> NodeEngine:
        return by_name[node.name]

    return connect


def container(name: str, cluster: str, role: str = "rank0", running: bool = True) -> Container:
    return Container(
        f"id-{name}",
        name,
        {"horovod-stack.cluster": cluster, "horovod-stack.role": role},
        "running" if running else "exited",
        ContainerState(name, running),
    )


# --- the agent's transport ---------------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Line:
    def __init__(self, address: str, heard: list[str]) -> None:
        self.address, self.heard = address, heard
        self.open, self.went_silent = True, False
        self.last_word: str | None = None

    def alive(self) -> bool:
        return self.open

    def silent(self) -> bool:
        return not self.open and self.went_silent

    def send(self, message: str) -> None:
        self.last_word, self.open = message, False
        self.heard.append(self.address)

    def wait(self) -> None:
        pass


class StandInTransport:
    """The agent's side effects without ssh or processes. Workers are addresses: each publishes its host key and
    answers ssh from a time in `up_from` on (all, always, without one), until lost; with `keys`, a worker answers
    only while its key in `keys` is the one pinned (nothing is published: the MPIJob launch learns keys). The job's
    process exits with `status`, at once or (`until_stopped`) once the agent stops it; with `stacks_of`, it never
    prints again and each worker's ranks wait where given. Workers in `silent_in_job` go silent as the job starts
    (their connections close without a word); the job then runs until the agent ends it, or, once the agent has
    recorded them in JOB_LOST (an elastic job going on without them), exits with `status`. A restart's runs (after
    the first) exit with the statuses in `restarts`, in order (0 once they run out), losing no one; a lost worker
    in `returns_at` answers again from that time on, as a new worker (its container started again). The first run
    prints `output`."""

    def __init__(
        self,
        clock: Clock | None = None,
        up_from: dict[str, float] | None = None,
        resolves: list[str] | None = None,
        cannot_start: frozenset[str] | set[str] = frozenset(),
        status: int = 0,
        lost_in_job: frozenset[str] | set[str] = frozenset(),
        keys: dict[str, str] | None = None,
        stacks_of: dict[str, list[stacks.RankStack]] | None = None,
        until_stopped: bool = False,
        silent_in_job: frozenset[str] | set[str] = frozenset(),
        secret_values: dict[str, str] | None = None,
        restarts: tuple[int, ...] = (),
        returns_at: dict[str, float] | None = None,
        stop_asked: bool = False,
        output: tuple[str, ...] = (),
    ) -> None:
        self.clock, self.up_from, self.resolves = clock or Clock(), up_from, resolves or []
        self.cannot_start, self.status, self.lost_in_job = cannot_start, status, lost_in_job
        self.keys, self.stacks_of, self.until_stopped = keys, stacks_of, until_stopped
        self.silent_in_job = silent_in_job
        self.secret_values = secret_values or {}
        """What the job's secret settings would be, handed in as the launcher hands them."""
        self.restarts, self.returns_at, self.told_to_stop = list(restarts), returns_at or {}, stop_asked
        self.output = output
        """The lines the job's first run prints (tagged with their ranks, as mpirun writes them)."""
        self.keras = legacy_keras.Watch()
        self.errors = RankErrors()
        self.removed: list[str] = []
        self.ran_with: dict[str, str] = {}
        """The environment the job's process got besides the agent's own."""
        self.fresh: set[str] = set()
        """Workers whose container started again since the agent claimed them (none claimed it since)."""
        self.files: dict[str, str] = {}
        self.modes: dict[str, int] = {}
        self.lines: dict[str, Line] = {}
        self.heard: list[str] = []
        """Addresses in the order their connections got the last word."""
        self.told: dict[str, str] = {}
        self.ran: list[list[str]] = []
        self.run_dirs: list[str] = []
        self.commands: list[tuple[str, str]] = []
        self.ended = threading.Event()

    def up(self, address: str) -> bool:
        return self.up_from is None or self.clock() >= self.up_from.get(address, float("inf"))

    def resolve(self, service: str) -> list[str]:
        return list(self.resolves)

    def read(self, path: str) -> str | None:
        address = path.removeprefix(f"{HOSTKEYS_DIR}/").removesuffix(".pub")
        if path.startswith(HOSTKEYS_DIR) and self.keys is None:
            return f"ssh-ed25519 KEY-{address} mpiuser@{address}\n" if self.up(address) else None
        return self.files.get(path)

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        self.files[path], self.modes[path] = text, mode

    def remove(self, path: str) -> None:
        self.files.pop(path, None)
        self.removed.append(path)

    def ssh(self, address: str, command: str, timeout: float, stdin: str = "") -> tuple[int, str]:
        self.commands.append((address, command))
        if not self.up(address):
            return 255, f"ssh: connect to host {address} port 12345: Connection refused"
        if self.keys is not None:
            pinned = f"[{address}]:12345 {self.keys[address]}"
            if pinned not in self.files.get(KNOWN_HOSTS, "").splitlines():
                return 255, "host key changed"
        if f"launcher.agent {AGENT_LINK} " in command:
            self.told[address] = stdin.strip()
        if command.startswith("test ! -e") and "claimed" in command:
            return (0, "") if address in self.fresh else (1, "")
        if "probe" in command and address in self.cannot_start:
            return 1, "script t.py is not there\n"
        if "stacks collect" in command and self.stacks_of is not None:
            return 0, stacks.to_json(self.stacks_of[address]) + "\n"
        return 0, ""

    def lifeline(self, address: str, command: str) -> Line:
        assert f"launcher.agent {AGENT_LINK} --driver" in command
        self.lines[address] = Line(address, self.heard)
        return self.lines[address]

    def list_folder(self, path: str) -> list[str]:
        return []

    def take_secrets(self, names: tuple[str, ...]) -> dict[str, str]:
        return {name: self.secret_values[name] for name in names if name in self.secret_values}

    def run(self, argv: list[str], cwd: str, env: dict[str, str] | None = None) -> int:
        self.ran.append(argv)
        self.ran_with = dict(env or {})
        self.keras = legacy_keras.Watch(argv)
        self.errors = RankErrors()
        if len(self.ran) > 1:  # a restart
            return self.restarts.pop(0) if self.restarts else 0
        for line in self.output:
            if not self.errors.feed(line):
                self.keras.feed(line)
        if self.silent_in_job:
            return self.run_until_silence_is_handled()
        if self.until_stopped:
            assert self.ended.wait(10), "the agent never stopped the job"
            return 143  # mpirun, told SIGTERM
        for address in self.lost_in_job:
            self.lose(address)
            self.lines[address].open = False
        return self.status

    def lose(self, address: str) -> None:
        """The worker stops answering; one in `returns_at` answers again from then on, as a new worker."""
        assert self.up_from is not None
        self.up_from[address] = self.returns_at.get(address, float("inf"))
        if address in self.returns_at:
            self.fresh.add(address)

    def run_until_silence_is_handled(self) -> int:
        for address in self.silent_in_job:
            self.lose(address)
            self.lines[address].open, self.lines[address].went_silent = False, True
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.ended.is_set():
                return 143  # mpirun, told SIGTERM
            if set(self.silent_in_job) <= set(self.files.get(JOB_LOST, "").split()):
                return self.status
            time.sleep(0.05)
        raise AssertionError("the agent neither ended the job nor dropped the silent workers")

    def output_age(self) -> float:
        return 999.0 if self.stacks_of is not None else 0.0

    def file_age(self, path: str) -> float | None:
        return None

    def horovod_warning(self) -> str | None:
        return None

    def keras2_rank(self) -> int | None:
        return self.keras.rank

    def rank_error(self) -> RankError | None:
        return self.errors.cause()

    def stop_job(self) -> bool:
        self.ended.set()
        return True

    def stop_asked(self) -> bool:
        return self.told_to_stop

    def make_cluster_key(self) -> None:
        self.files["cluster key"] = "made"

    def make_run_dir(self, folder: str) -> None:
        self.run_dirs.append(folder)


if TYPE_CHECKING:  # each stand-in against the protocol it stands in for
    from launcher.agent.transport import Transport

    _engine: NodeEngine = StandInEngine("node_1")
    _partial: NodeEngine = PartialEngine()
    _transport: Transport = StandInTransport()
