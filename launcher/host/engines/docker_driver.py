"""NodeDriver: one node's engine (the NodeEngine protocol, launcher/host/engines/node_engine.py) over the Docker SDK.
Nothing outside it touches a docker-py object: containers are Container records, found again by ID, and every exception
of the SDK's becomes a NodeError, the ones a method does not word itself through docker_sdk.translated_errors.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import docker
from docker.errors import APIError, ContainerError, DockerException, ImageNotFound, NotFound
from docker.types import DeviceRequest, Mount, Ulimit
from requests.exceptions import RequestException

from app.gpu import GPU_QUERY, CudaBuild, gpu_problem
from launcher.core import layers, restart
from launcher.core.mounts import Bind
from launcher.core.nics import IP_ADDRESSES
from launcher.core.protocol import HOME, RUNS_DIR, SHARED_MOUNT
from launcher.host.engines import reach, streams
from launcher.host.engines.docker_sdk import first_line, translated_errors
from launcher.host.engines.node_engine import REMOVED, Container, ContainerState, Failure, Loss, NodeError, pull_failure
from launcher.host.planning import access
from launcher.host.planning.plan import LABEL_CLUSTER, LABEL_NODE, GpuRequest, Node, WorkerContainer
from launcher.host.planning.preflight import HostView

PUSH_TIMEOUT_S = 3600


def device_request(gpu: GpuRequest) -> DeviceRequest:
    if gpu.device_ids:
        return DeviceRequest(device_ids=list(gpu.device_ids), capabilities=[["gpu"]])
    return DeviceRequest(count=gpu.count, capabilities=[["gpu"]])


def bind_mount(bind: Bind) -> Mount:
    # A bind Mount, unlike a -v volume, fails on a missing host path instead of making an empty folder there.
    return Mount(target=bind.target, source=bind.source, type="bind", read_only=bind.read_only)


def parse_host_view(output: str) -> HostView | None:
    """host_view's container output (host_view_argv) as a HostView; None when it printed nothing."""
    port_state, *lines = output.splitlines() or [""]
    if not port_state.strip():
        return None
    rows = [line.split() for line in lines]
    return HostView(
        port_taken=port_state.strip() == "taken",
        nics=tuple(row[1] for row in rows if row[:1] == ["nic"] and len(row) == 2),
        addresses=tuple((row[1], row[2]) for row in rows if row[:1] == ["address"] and len(row) == 3),
        resolved=tuple((row[1], row[2]) for row in rows if row[:1] == ["resolved"] and len(row) == 3),
    )


def host_view_argv(port: int, resolve: tuple[str, ...]) -> list[str]:
    """The command of host_view's container: whether `port` is taken, the NICs, the IPv4 addresses, then one
    `resolved NAME ADDRESS` line per name in `resolve` that resolves. The names reach bash only as positional
    arguments, never inside the script's text, so no name can be read as shell or awk code."""
    script = (
        # NICs over netlink: the container's /sys may be the engine's mount of another network namespace.
        f"(exec 3<>/dev/tcp/127.0.0.1/{int(port)}) 2>/dev/null && echo taken || echo free; "
        "ip -o link show | awk -F': ' '{sub(/@.*/, \"\", $2); print \"nic\", $2}'; "
        f"{' '.join(IP_ADDRESSES)} | awk '{{print \"address\", $2, $4}}'; "
        'for name in "$@"; do '
        "address=$(getent ahostsv4 \"$name\" | awk '{print $1; exit}'); "
        '[ -n "$address" ] && printf \'resolved %s %s\\n\' "$name" "$address"; '
        "done; true"
    )
    return ["bash", "-c", script, "bash", *resolve]


@translated_errors
class NodeDriver:
    """One node's engine over the Docker SDK (the module's docstring)."""

    def __init__(self, node: Node, client: docker.DockerClient) -> None:
        self.node = node
        self.client = client

    @classmethod
    def connect(cls, node: Node, timeout: float = 30) -> NodeDriver:
        """The node's engine (its address and TLS as launcher.host.planning.access reads them), or one NodeError
        (unreachable) within about node.connect_timeout seconds."""
        options = access.client_options(node.engine_url, node.tls)
        folder = node.tls.folder()[0] if node.tls is not None and options.get("tls") else None
        unreachable = reach.probe(node.engine_url, node.connect_timeout, tls=folder is not None)
        if unreachable:
            raise NodeError(
                node.name,
                f"cannot reach its Docker engine at {node.engine_url} (another address: "
                f"{access.engine_override_key(node.name)} in .env): {unreachable}",
                Failure.UNREACHABLE,
            )
        try:
            # The system ssh client honours the user's ssh config (keys, known_hosts, jump hosts).
            client = docker.DockerClient(
                **options, use_ssh_client=node.engine_url.startswith("ssh://"), timeout=int(timeout)
            )
            client.ping()
        except (DockerException, OSError) as error:
            tls_problem = reach.tls_failure(node.name, node.engine_url, str(error), folder)
            if tls_problem:
                raise NodeError(node.name, tls_problem, Failure.UNREACHABLE) from None
            raise NodeError(
                node.name,
                f"cannot reach its Docker engine at {node.engine_url} ({first_line(error)}); check the host is up "
                f"and runs Docker, or point {access.engine_override_key(node.name)} in .env at its engine",
                Failure.UNREACHABLE,
            ) from None
        return cls(node, client)

    @classmethod
    def local(cls) -> NodeDriver:
        """This machine's own engine (DOCKER_HOST or the local socket), where --push-image copies from."""
        node = Node("this machine", "local")
        try:
            client = docker.from_env()
            client.ping()
        except (DockerException, OSError) as error:
            raise NodeError(
                node.name, f"its Docker engine is not reachable ({first_line(error)})", Failure.UNREACHABLE
            ) from None
        return cls(node, client)

    def version(self) -> str:
        return str(self.client.version().get("Version", "?"))

    def host_name(self) -> str:
        """The node's own host name, as its engine reports it (what a host-network container would take)."""
        return str(self.client.info().get("Name", ""))

    def _get(self, container_id: str):
        """The SDK's container object; NodeError (not found) once it is gone."""
        try:
            return self.client.containers.get(container_id)
        except NotFound:
            raise NodeError(self.node.name, f"container {container_id[:12]} is gone", Failure.NOT_FOUND) from None

    def _record(self, container) -> Container:
        state = container.attrs["State"]
        return Container(
            id=container.id,
            name=container.name,
            labels=dict(container.labels),
            status=container.status,
            state=ContainerState(
                node=container.labels.get(LABEL_NODE, self.node.name),
                running=state.get("Status") == "running",
                exit_code=state.get("ExitCode"),
                finished_at=None if state.get("Status") == "running" else state.get("FinishedAt"),
            ),
        )

    # --- inspection -------------------------------------------------------------------------------------------
    def image_id(self, image: str) -> str | None:
        try:
            return self.client.images.get(image).id
        except ImageNotFound:
            return None

    def cluster_containers(self, cluster_id: str | None = None) -> list[Container]:
        """The stack's containers on this node, running or stopped (one cluster's, or every cluster's)."""
        label = f"{LABEL_CLUSTER}={cluster_id}" if cluster_id else LABEL_CLUSTER
        found = []
        for listed in self.client.api.containers(all=True, filters={"label": label}):
            try:
                found.append(self._record(self.client.containers.get(listed["Id"])))
            except NotFound:  # removed between the listing and its inspection (a worker winding down, a probe)
                continue
        return found

    def clock_skew_seconds(self) -> float:
        engine_time = self.client.info()["SystemTime"]
        # Docker reports RFC 3339 with nanoseconds; keep microseconds for fromisoformat.
        stamp = engine_time[:26].rstrip("Z") if "." in engine_time else engine_time.rstrip("Z")
        engine = datetime.fromisoformat(stamp).replace(tzinfo=UTC)
        return (engine - datetime.now(UTC)).total_seconds()

    def image_labels(self, image: str) -> dict[str, str]:
        return dict(self.client.images.get(image).labels or {})

    def gpu_problem(self, image: str, gpu: GpuRequest, build: CudaBuild) -> str | None:
        """Why this node cannot give a worker the GPUs asked for (the toolkit, the count or IDs, the driver and the
        GPUs' age against `build`, the image's framework's), from nvidia-smi in a short-lived container with the
        workers' own device request; None if it can."""
        try:
            output = self.client.containers.run(
                image, list(GPU_QUERY), remove=True, device_requests=[device_request(gpu)]
            )
        except (APIError, ContainerError) as error:
            return (
                f"no GPUs reach a container there ({first_line(error)}); install the NVIDIA Container Toolkit, "
                "run `nvidia-ctk runtime configure --runtime=docker` and restart Docker"
            )
        return gpu_problem(output.decode(errors="replace"), len(gpu.device_ids) or gpu.count, build)

    def missing_bind(self, image: str, binds: tuple[Bind, ...]) -> str | None:
        """Why a worker could not have the user's folders (a host path not there), from a short-lived container
        with the same binds; None if it could."""
        try:
            self.client.containers.run(image, ["true"], remove=True, mounts=[bind_mount(bind) for bind in binds])
        except (APIError, ContainerError) as error:
            return first_line(error)
        return None

    def list_runs(self, image: str, shared_dir: str) -> list[tuple[str, int]]:
        """(folder, modified) for each run folder in the node's shared folder (RUNS_DIR), from a short-lived container
        of the image with that folder mounted read-only."""
        output = self.client.containers.run(
            image,
            ["bash", "-c", f"cd {RUNS_DIR} 2>/dev/null && find . -mindepth 1 -maxdepth 1 -type d -printf '%f %T@\\n'"],
            volumes={shared_dir: {"bind": SHARED_MOUNT, "mode": "ro"}},
            remove=True,
        )
        rows = [line.split() for line in output.decode().splitlines()]
        return [(row[0], int(float(row[1]))) for row in rows if len(row) == 2]

    def run_entries(self, image: str, shared_dir: str, name: str) -> list[str]:
        """The names directly inside the run folder `name` (RUNS_DIR/name), from a short-lived container of the image
        with the shared folder mounted read-only; the folder's path reaches bash as an argument."""
        output = self.client.containers.run(
            image,
            ["bash", "-c", 'cd "$1" && find . -mindepth 1 -maxdepth 1 -printf "%f\\n"', "bash", f"{RUNS_DIR}/{name}"],
            volumes={shared_dir: {"bind": SHARED_MOUNT, "mode": "ro"}},
            remove=True,
        )
        return sorted(line for line in output.decode().splitlines() if line)

    def run_archive(self, image: str, shared_dir: str, name: str) -> Iterator[bytes]:
        """RUNS_DIR/name (a run folder, or a part of one: `RUN/tb`) as a tar stream, as it arrives, from a created
        (never started) container with the shared folder."""
        holder = self.client.containers.create(
            image, ["true"], volumes={shared_dir: {"bind": SHARED_MOUNT, "mode": "ro"}}
        )
        try:
            chunks, _ = holder.get_archive(f"{RUNS_DIR}/{name}")
            yield from chunks
        finally:
            holder.remove(force=True)

    def host_view(self, image: str, port: int, resolve: tuple[str, ...] = ()) -> HostView:
        """Whether something on the node already listens on `port`, the node's NICs and addresses, and what the
        names in `resolve` resolve to there, from one short-lived host-network container of the image (what the
        workers will see, whatever the launcher's machine has)."""
        # Twice at most: on a busy node the container's output has come back empty (seen once in a full test run).
        for _ in range(2):
            output = self.client.containers.run(
                image, host_view_argv(port, resolve), network_mode="host", remove=True, user="mpiuser"
            )
            view = parse_host_view(output.decode(errors="replace"))
            if view is not None:
                return view
        raise NodeError(
            self.node.name,
            f"a short-lived container of {image} printed nothing, twice; run `docker run --rm --network host {image} "
            "ip -brief address` there to see why",
        )

    def start_probe(self, image: str, argv: list[str], name: str, labels: dict[str, str]) -> str:
        """A short-lived host-network container of the image running `argv` (launcher doctor --links); the caller
        removes it by its cluster label (remove_cluster), whatever happens."""
        try:
            return self.client.containers.run(
                image, argv, name=name, labels=labels, network_mode="host", user="mpiuser", detach=True
            ).id
        except APIError as error:
            raise NodeError(
                self.node.name, f"a link-test container did not start ({first_line(error)})", Failure.REFUSED
            ) from None

    def wait_for_output(self, container_id: str, text: str, timeout: float) -> str | None:
        """The container's output once it holds `text`, or once the container has ended; None on timeout."""
        container = self._get(container_id)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                output = container.logs().decode(errors="replace")
                if text in output:
                    return output
                container.reload()
                if container.status not in ("created", "running"):
                    return container.logs().decode(errors="replace")
                time.sleep(0.2)
        except NotFound:  # removed meanwhile (an interruption's clean-up): what it said is gone with it
            return ""
        return None

    def finish(self, container_id: str, timeout: float) -> str:
        """The container's output after it has ended (at most `timeout` seconds from now)."""
        container = self._get(container_id)
        try:
            container.wait(timeout=timeout)
        except NotFound:
            return ""
        except (RequestException, APIError):  # still running: what it printed so far
            pass
        try:
            return container.logs().decode(errors="replace")
        except NotFound:
            return ""

    # --- the image --------------------------------------------------------------------------------------------
    def image_size(self, image: str) -> int:
        return self.client.images.get(image).attrs.get("Size") or 0

    def save_image(self, image: str) -> Iterator[bytes]:
        """The image as `docker save` streams it (named=True keeps the tag, so a node finds it by the plan's
        name)."""
        saved = self.client.api.timeout
        self.client.api.timeout = PUSH_TIMEOUT_S  # several GB take minutes: no read timeout while it streams
        try:
            yield from self.client.images.get(image).save(chunk_size=8 * 1024 * 1024, named=True)
        finally:
            self.client.api.timeout = saved

    def image_layers(self, image: str) -> list[str]:
        """The image's layers (diff IDs), bottom first."""
        return list(self.client.images.get(image).attrs["RootFS"]["Layers"])

    def layer_chains(self) -> set[str]:
        """The chain IDs of every layer of every image this engine holds (launcher/core/layers.py). Empty where the
        engine keeps its images in containerd's store, whose load of a partial archive was not tried: there the
        image is sent whole."""
        driver_status = dict(tuple(pair) for pair in self.client.info().get("DriverStatus") or [] if len(pair) == 2)
        if "containerd" in driver_status.get("driver-type", ""):
            return set()
        return {
            chain
            for summary in self.client.api.images()
            for chain in layers.chain_ids(self.client.api.inspect_image(summary["Id"])["RootFS"].get("Layers") or [])
        }

    def load_image(self, chunks: Iterator[bytes], image: str) -> None:
        saved = self.client.api.timeout
        self.client.api.timeout = PUSH_TIMEOUT_S
        try:
            self.client.images.load(chunks)
        except Exception as error:  # the SDK, requests or the socket: all mean the copy failed
            raise NodeError(
                self.node.name,
                f"copying {image} failed ({first_line(error)}); free disk space on the node or load the image there "
                "by hand",
            ) from None
        finally:
            self.client.api.timeout = saved

    def pull_image(self, image: str, progress: Callable[[int, int], None]) -> None:
        """Pulls `image` from its registry into this engine; `progress(bytes done, bytes known)` as layers come.
        Credentials are this machine's (`docker login` here): the Docker API takes them from the client."""
        layers: dict[str, tuple[int, int]] = {}
        saved = self.client.api.timeout
        self.client.api.timeout = PUSH_TIMEOUT_S
        try:
            # The SDK splits NAME:TAG and NAME@DIGEST itself (a digest travels as the tag, as the Engine API takes it).
            for event in self.client.api.pull(image, stream=True, decode=True):
                if "error" in event:
                    raise NodeError(self.node.name, pull_failure(self.node.name, image, str(event["error"])))
                detail = event.get("progressDetail") or {}
                if event.get("id") and detail.get("total"):
                    layers[event["id"]] = (int(detail.get("current", 0)), int(detail["total"]))
                    progress(sum(done for done, _ in layers.values()), sum(total for _, total in layers.values()))
        except DockerException as error:
            raise NodeError(self.node.name, pull_failure(self.node.name, image, first_line(error))) from None
        finally:
            self.client.api.timeout = saved

    # --- the worker container ---------------------------------------------------------------------------------
    def start_worker(self, spec: WorkerContainer) -> Container:
        try:
            container = self.client.containers.run(
                spec.image,
                ["worker"],
                name=spec.name,
                labels=spec.labels,
                environment=spec.environment,
                network_mode="host",
                shm_size=spec.shm_size,
                volumes={source: {"bind": target, "mode": "rw"} for source, target in spec.volumes.items()},
                mounts=[bind_mount(bind) for bind in spec.binds] or None,
                device_requests=[device_request(spec.gpu)] if spec.gpu else None,
                ulimits=[Ulimit(name=name, soft=limit, hard=limit) for name, limit in spec.ulimits.items()],
                user=spec.user,
                cap_drop=["ALL"],
                cap_add=list(spec.capabilities),
                security_opt=["no-new-privileges"] if spec.no_new_privileges else None,
                devices=list(spec.devices) or None,
                hostname=spec.hostname,
                extra_hosts=spec.extra_hosts or None,
                restart_policy=restart.worker_restart_policy(spec.restarts),
                detach=True,
            )
        except APIError as error:
            raise NodeError(
                self.node.name, f"the worker container did not start ({first_line(error)})", Failure.REFUSED
            ) from None
        return self._record(container)

    def put_files(self, container_id: str, path: str, archive: bytes) -> None:
        if not self.client.api.put_archive(container_id, path, archive):
            raise NodeError(
                self.node.name, f"could not write files into container {container_id[:12]}:{path}", Failure.REFUSED
            )

    def read_file(self, container_id: str, path: str) -> str | None:
        """A file's text from a container, running or stopped (the archive API needs no exec); None if absent."""
        try:
            stream, _ = self.client.api.get_archive(container_id, path)
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
                content = archive.extractfile(archive.getmembers()[0])
                return content.read().decode(errors="replace") if content else None
        except (NotFound, IndexError, tarfile.TarError):
            return None

    def stream_file(self, container_id: str, path: str) -> Iterator[bytes] | None:
        """A file's bytes from a container, running or stopped, as they arrive (a long job log is never whole in
        memory); None if absent."""
        try:
            stream, _ = self.client.api.get_archive(container_id, path)
        except NotFound:
            return None
        return streams.file_in_archive(stream)

    def logs(self, container_id: str) -> Iterator[bytes]:
        """The container's own output so far (its entrypoint's: sshd, the worker's lines)."""
        yield from self._get(container_id).logs(stream=True, follow=False)

    def worker_problem(self, container_id: str) -> str | None:
        """Why the worker container is not running, or None while it runs."""
        try:
            container = self.client.containers.get(container_id)
        except NotFound:
            return str(REMOVED)
        lost = self._loss(container)
        if lost or container.status == "running":
            return str(lost) if lost else None
        exit_code = container.attrs["State"].get("ExitCode")
        last_line = container.logs(tail=1).decode().strip() or "no output"
        return f"its worker container stopped (exit status {exit_code}; last output: {last_line})"

    def lost_reason(self, container_id: str) -> Loss | None:
        """Why the worker is lost, if it was: removed, or killed (docker kill, out of memory, a crash by signal). A
        container that ended by itself (its job over, its status its own) is not lost."""
        try:
            return self._loss(self.client.containers.get(container_id))
        except NotFound:
            return REMOVED

    @staticmethod
    def _loss(container) -> Loss | None:
        state = container.attrs["State"]
        if container.status == "running":
            return None
        if state.get("OOMKilled"):
            return Loss("its worker container was killed (out of memory)")
        return Loss("its worker container stopped (killed)") if state.get("ExitCode") == 137 else None

    def exec_stream(self, container_id: str, argv: list[str]) -> tuple[str, Iterator[bytes]]:
        exec_id = self.client.api.exec_create(container_id, argv, user="mpiuser", workdir=HOME)["Id"]
        return exec_id, self.client.api.exec_start(exec_id, stream=True)

    def exec_detached(self, container_id: str, argv: list[str]) -> None:
        exec_id = self.client.api.exec_create(container_id, argv, user="mpiuser", workdir=HOME)["Id"]
        self.client.api.exec_start(exec_id, detach=True)

    def exec_exit_code(self, exec_id: str) -> int | None:
        return self.client.api.exec_inspect(exec_id).get("ExitCode")

    def remove_cluster(self, cluster_id: str | None = None) -> int:
        """Force-removes the cluster's containers on this node; returns how many there were."""
        label = f"{LABEL_CLUSTER}={cluster_id}" if cluster_id else LABEL_CLUSTER
        removed = 0
        for container in self.client.containers.list(all=True, filters={"label": label}):
            try:
                container.remove(force=True)
                removed += 1
            except NotFound:
                pass
        return removed
