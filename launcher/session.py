"""One launch from the user's machine: connect to every node, check them, start the workers with the cluster's SSH
trust, start the job agent in the rank-0 container, follow it (attached) or not (detached), and clean up.

The job itself is the agent's (launcher/agent.py): readiness, mpirun, the job's end and every worker's stop happen
in the cluster, so a job ends the same way whether this process stays, is stopped (SIGINT/SIGTERM/SIGHUP: the
cluster is removed) or dies outright (the job goes on and every container stops when it ends).
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import IO

import docker

from launcher import images, sshtrust, workdir
from launcher.driver import HostView, NodeDriver
from launcher.plan import (
    LABEL_CLUSTER,
    VIRTUAL_NIC_PREFIXES,
    WORKDIR,
    ClusterPlan,
    Node,
    nic_in_subnet,
    nic_problem,
    subnet_of,
    subnet_problem,
    virtual_subnets,
)
from launcher.protocol import (
    AGENT,
    AGENT_PREFIX,
    CLUSTER_SSH_DIR,
    HOSTKEYS_DIR,
    JOB_LOG,
    JOB_SPEC,
    JOB_STATUS,
    STOP_SIGNALS,
    JobEnd,
    Signalled,
    parse_job_end,
)
from launcher.settings import LaunchSettings

Say = Callable[[str], None]


class LaunchError(RuntimeError):
    """The launch stopped; the message is the one root cause, naming the fix."""


@contextmanager
def signals_ignored() -> Iterator[None]:
    saved = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def connect_all(plan: ClusterPlan, say: Say) -> list[NodeDriver]:
    def connect(node):
        driver = NodeDriver.connect(node)
        say(f"{node.name}: engine reachable at {node.engine_url}")
        return driver

    with ThreadPoolExecutor(max_workers=len(plan.nodes)) as pool:
        futures = [pool.submit(connect, node) for node in plan.nodes]
    errors = [future.exception() for future in futures if future.exception()]
    if errors:
        raise LaunchError(str(errors[0]))
    return [future.result() for future in futures]


def check_nodes(
    plan: ClusterPlan, drivers: list[NodeDriver], push_image: bool, say: Say, dry_run: bool = False
) -> ClusterPlan:
    """Every check a start makes before any container starts (old clusters, the image, the port, the NIC or subnet,
    the GPUs, the names Open MPI needs addresses for); returns the plan with what the checks found: each node's NIC
    in the subnet, the addresses, or, with no NIC pinned across nodes, the virtual NICs' subnets the job leaves out.
    A dry run copies no image: a node that lacks it is named, and checked once it has it."""
    node_list = ",".join(n.name for n in plan.nodes)
    for driver in drivers:
        containers = driver.cluster_containers()
        running = [c for c in containers if c.status == "running"]
        if running:
            cluster = running[0].labels.get(LABEL_CLUSTER)
            raise LaunchError(
                f"{driver.node.name}: cluster {cluster} is still running; stop it first with "
                f"`launcher stop --nodes {node_list} --cluster {cluster}`"
            )
        for cluster in sorted({c.labels.get(LABEL_CLUSTER) for c in containers}):
            say(
                f"{driver.node.name}: finished cluster {cluster} is kept for `launcher status` and `launcher logs`; "
                f"`launcher stop --nodes {node_list} --cluster {cluster}` removes it"
            )
    lacking = ensure_image_everywhere(plan, drivers, push_image, say, copy=not dry_run)
    addresses: list[tuple[str, str]] = []
    node_nics: list[tuple[str, str]] = []
    resolved: list[tuple[str, str]] = []
    for driver in drivers:
        if driver.node.name in lacking:
            say(f"{driver.node.name}: port, NIC and GPU checks run once the image is there")
            continue
        view, nic = check_node(plan, driver)
        addresses += view.addresses
        resolved += view.resolved
        if nic:
            node_nics.append((driver.node.name, nic))
        found = f", NIC {nic} in {plan.network_interface}" if nic else ""
        if plan.network_interface and not nic:
            found = f", NIC {plan.network_interface} present"
        say(f"{driver.node.name}: port {plan.ssh_port} free{found}")
    plan = dataclasses.replace(plan, node_nics=tuple(node_nics), addresses=tuple(resolved))
    if plan.network_interface or len(plan.nodes) == 1:
        return plan
    subnets = virtual_subnets(addresses)
    say(
        f"no NIC pinned: Open MPI and NCCL leave out {', '.join(f'{prefix}*' for prefix in VIRTUAL_NIC_PREFIXES)} "
        f"({', '.join(subnets) or 'no such subnet here'}); pin one with --network-interface if a node has more "
        "than one real NIC"
    )
    return dataclasses.replace(plan, excluded_subnets=tuple(subnets))


def check_node(plan: ClusterPlan, driver: NodeDriver) -> tuple[HostView, str | None]:
    """One node's checks, each failure one line naming the node and the fix: its NIC or an address in the subnet,
    the SSH port, the GPUs, the --mount folders, and (on rank 0's node) the addresses of names Open MPI refuses.
    Returns what the node looks like and its NIC in the subnet, if one was asked for."""
    node = driver.node.name
    subnet = subnet_of(plan.network_interface)
    names = tuple(other.name for other in plan.needs_addresses()) if driver.node == plan.rank0 else ()
    view = driver.host_view(plan.image, plan.ssh_port, resolve=names)
    problem = subnet_problem(subnet, view.addresses) if subnet else nic_problem(plan.network_interface, view.nics)
    if problem:  # else mpirun fails after every container started, in paragraphs that never name the NIC
        raise LaunchError(f"{node}: {problem}")
    if view.port_taken:
        raise LaunchError(
            f"{node}: port {plan.ssh_port} is already in use there; free it or pass --ssh-port with a free port"
        )
    gpu_request = plan.gpu_request(driver.node)
    gpu = driver.gpu_problem(plan.image, gpu_request) if gpu_request else None
    if gpu:  # else Docker's raw error after the first worker started, or a job that trains on the CPU
        raise LaunchError(f"{node}: {gpu}")
    missing = driver.missing_bind(plan.image, plan.binds) if plan.binds else None
    if missing:  # else Docker's error after other workers started
        raise LaunchError(
            f"{node}: a --mount folder is not there ({missing}); make it, or mount the same share at that path on "
            "every node"
        )
    unresolved = sorted(set(names) - {name for name, _ in view.resolved})
    if unresolved:
        raise LaunchError(f"{unresolved[0]} does not resolve on {node}; add it to DNS or /etc/hosts on every node")
    return view, nic_in_subnet(view.addresses, subnet) if subnet else None


def check_same_image(image: str, ids: Mapping[str, str | None]) -> None:
    if len(set(ids.values())) > 1:
        listing = ", ".join(f"{name} {(image_id or '-')[7:19]}" for name, image_id in ids.items())
        raise LaunchError(
            f"image {image} differs between nodes ({listing}); mismatched Horovod/MPI builds "
            "hang, so load one image on every node (docker save | docker load)"
        )


def this_machine(image: str) -> tuple[NodeDriver, str | None]:
    """This machine's own engine (where --push-image copies from) and its ID of `image`, or one LaunchError."""
    try:
        driver = NodeDriver(Node("this machine", "local"), docker.from_env())
        return driver, driver.image_id(image)
    except docker.errors.DockerException as error:
        raise LaunchError(f"--push-image: this machine's Docker engine is not reachable ({error})") from None


def ensure_image_everywhere(
    plan: ClusterPlan, drivers: list[NodeDriver], push_image: bool, say: Say, copy: bool = True
) -> set[str]:
    """The same image on every node: pulled where IMAGE names a registry, copied from this machine's engine where
    --push-image asks for it; returns the nodes that still lack it (only where `copy` is False: a dry run)."""
    missing = [driver for driver in drivers if driver.image_id(plan.image) is None]
    registry = images.registry_of(plan.image)
    if missing and not push_image and not registry:
        raise LaunchError(
            f"{missing[0].node.name}: image {plan.image} is not there; pass --push-image to copy it "
            "from this machine's engine, load it on that node, or name it in a registry (IMAGE=REGISTRY/NAME:TAG)"
        )
    if missing and not copy:
        how = "pulls it from " + registry if registry and not push_image else "copies it there from this machine"
        for driver in missing:
            say(f"{driver.node.name}: lacks {plan.image}; a start {how}")
        present = {driver.node.name: driver.image_id(plan.image) for driver in drivers if driver not in missing}
        if push_image:  # the nodes that have it must hold the very image the copy would bring
            present["this machine"] = this_machine(plan.image)[1]
        check_same_image(plan.image, present)
        return {driver.node.name for driver in missing}
    if missing and push_image:
        source, source_image = this_machine(plan.image)
        if source_image is None:
            raise LaunchError(
                f"--push-image: this machine's engine has no image {plan.image} either; build it "
                "with scripts/build-images.sh"
            )
        images.push_everywhere(source, missing, plan.image, say)
    elif missing:
        images.pull_everywhere(missing, plan.image, say)
    found = {driver.node.name: driver.image_id(plan.image) for driver in drivers}
    still_missing = [name for name, image_id in found.items() if image_id is None]
    ids = {name: image_id for name, image_id in found.items() if image_id}
    if still_missing:
        raise LaunchError(
            f"{still_missing[0]}: image {plan.image} is still missing after the copy; load it there by hand"
        )
    check_same_image(plan.image, ids)
    say(f"image {plan.image} ({next(iter(ids.values()))[7:19]}) is the same on all {len(drivers)} nodes")
    return set()


def hand_over_trust(
    plan: ClusterPlan,
    drivers: list[NodeDriver],
    containers: list,
    keys: sshtrust.KeyPair,
    deadline: float,
    keep_running: bool,
    say: Say,
) -> None:
    """The cluster's public key to every worker; to rank 0's container the private key, every worker's host key (as
    the agent pins them) and the job spec the agent runs."""
    authorized = sshtrust.tar_files({"authorized_keys": (keys.public.encode() + b"\n", 0o600)})
    host_keys = {}
    for driver, container in zip(drivers, containers, strict=True):
        driver.put_files(container, CLUSTER_SSH_DIR, authorized)
        host_keys[plan.mpi_host(driver.node)] = wait_for_host_key(driver, container, deadline)
    rank0, container = drivers[0], containers[0]
    rank0.put_files(container, CLUSTER_SSH_DIR, sshtrust.tar_files({"id_ed25519": (keys.private, 0o600)}))
    rank0.put_files(
        container,
        HOSTKEYS_DIR,
        sshtrust.tar_files({f"{host}.pub": (f"{key}\n".encode(), 0o644) for host, key in host_keys.items()}),
    )
    spec = PurePosixPath(JOB_SPEC)
    rank0.put_files(
        container,
        str(spec.parent),
        sshtrust.tar_files({spec.name: (plan.job_spec(keep_running).to_json().encode(), 0o644)}),
    )
    say(
        "SSH trust handed over: cluster key in every worker; rank 0 holds the private key, the workers' host keys "
        "and the job"
    )


def copy_workdir(plan: ClusterPlan, drivers: list[NodeDriver], containers: list, say: Say) -> None:
    """The user's code folder to WORKDIR in every worker container, through the Docker API (no NFS needed)."""
    assert plan.workdir is not None
    archive = workdir.archive(Path(plan.workdir))
    for driver, container in zip(drivers, containers, strict=True):
        driver.put_files(container, WORKDIR, archive)
    say(f"code: {plan.workdir} copied to {WORKDIR} on {len(drivers)} node(s) ({len(archive) / 1024:.0f} KB)")


def wait_for_host_key(driver: NodeDriver, container, deadline: float) -> str:
    while True:
        content = driver.read_file(container, f"{HOSTKEYS_DIR}/{driver.node.name}.pub")
        if content:
            return " ".join(content.split()[:2])
        problem = driver.worker_problem(container)
        if problem:
            raise LaunchError(f"{driver.node.name}: {problem}")
        if time.monotonic() > deadline:
            raise LaunchError(
                f"{driver.node.name}: the worker made no SSH host key in time; see `launcher logs "
                f"--node {driver.node.name}`"
            )
        time.sleep(0.5)


FOLLOW_ATTEMPTS = 5
"""How often the launcher re-attaches to a running job whose log stream broke (an engine connection dropped)."""


def follow_job(driver: NodeDriver, container, out: IO[str], relay: Say) -> JobEnd | None:
    """Streams the agent's log from rank 0's container until the job ends: the job's output to `out`, the agent's
    own lines to `relay`. Returns how the job ended, or None when rank 0's container ended first."""
    received, pending = 0, b""
    for _ in range(FOLLOW_ATTEMPTS):
        _, stream = driver.exec_stream(container, [*AGENT, "follow", "--from", str(received)])
        for chunk in stream:
            received += len(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                text = line.decode(errors="replace")
                if text.startswith(AGENT_PREFIX):
                    relay(text)
                else:
                    out.write(text + "\n")
            out.flush()
        end = parse_job_end(driver.read_file(container, JOB_STATUS))
        if end is not None or driver.worker_problem(container):
            break
    if pending:
        out.write(pending.decode(errors="replace"))
    return end


class WorkerWatch(threading.Thread):
    """An attached elastic job's eye on the workers other than rank 0's: says when one stops (the job goes on
    without it) and, with restart, starts its container again: same host key and cluster key, so it rejoins at
    the next host discovery. It opens its own engine connections; the main thread's stream the job's output."""

    MAX_RESTARTS = 5

    def __init__(self, plan: ClusterPlan, containers: list, restart: bool, say: Say) -> None:
        super().__init__(name="worker-watch", daemon=True)
        self.plan, self.restart, self.say = plan, restart, say
        self.container_ids = {node.name: c.id for node, c in zip(plan.nodes[1:], containers[1:], strict=True)}
        self.lost: dict[str, str] = {}
        """Nodes whose worker is down right now, and why."""
        self.restarts: dict[str, int] = {}
        self.done = threading.Event()

    def run(self) -> None:
        try:
            drivers = {node.name: NodeDriver.connect(node) for node in self.plan.nodes[1:]}
            containers = {name: drivers[name].client.containers.get(cid) for name, cid in self.container_ids.items()}
            while not self.done.wait(1):
                for name, container in containers.items():
                    self.check(name, drivers[name], container)
        except Exception as error:  # the job goes on; only the watching stops
            self.say(f"worker watch stopped: {type(error).__name__}: {error}")

    def check(self, name: str, driver: NodeDriver, container) -> None:
        problem = driver.lost_reason(container)
        if problem is None:
            self.lost.pop(name, None)
            return
        if name not in self.lost:
            self.say(f"{name}: {problem}; the elastic job goes on without it")
        self.lost[name] = problem
        if self.restart and "removed" not in problem and self.restarts.get(name, 0) < self.MAX_RESTARTS:
            self.restarts[name] = self.restarts.get(name, 0) + 1
            container.start()
            self.say(
                f"{name}: worker started again (restart {self.restarts[name]} of at most "
                f"{self.MAX_RESTARTS}); it rejoins at the next host discovery"
            )

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=10)


def elastic_failure(
    plan: ClusterPlan, drivers: list[NodeDriver], containers: list, watch: WorkerWatch, rank0_ended_first: bool
) -> str | None:
    """The root cause when an elastic job fails: its driver's node lost, or too few nodes left."""
    problem = drivers[0].lost_reason(containers[0]) if rank0_ended_first else None
    if problem:
        return (
            f"{plan.rank0.name}: {problem} during the run; the elastic driver runs on rank 0's node, so the job "
            "ended with it"
        )
    if watch.lost:
        lost = "; ".join(f"{name} ({why})" for name, why in sorted(watch.lost.items()))
        return (
            f"the elastic job fell below --min-nodes {plan.elastic_min_nodes} for {plan.elastic_timeout} s: lost {lost}"
        )
    return None


def dead_worker(drivers: list[NodeDriver], containers: list, rank0_ended_first: bool) -> str | None:
    """A worker killed or removed during the run (rank 0's own exit code is the job's once the job has ended)."""
    start = 0 if rank0_ended_first else 1
    for driver, container in zip(drivers[start:], containers[start:], strict=True):
        problem = driver.lost_reason(container)
        if problem:
            return f"{driver.node.name}: {problem} during the run"
    return None


def cleanup(drivers: list[NodeDriver], cluster_id: str, say: Say) -> None:
    removed = 0
    for driver in drivers:
        try:
            removed += driver.remove_cluster(cluster_id)
        except Exception as error:  # keep cleaning the other nodes
            say(f"{driver.node.name}: cleanup failed ({error}); run `launcher stop` for it")
    say(f"cleanup: removed {removed} container(s) of cluster {cluster_id}")


def start_agent(
    plan: ClusterPlan, drivers: list[NodeDriver], containers: list, detach: bool, keep_running: bool, say: Say
) -> None:
    drivers[0].exec_detached(containers[0], [*AGENT, "run", "--log", JOB_LOG])
    say(
        f"job agent started in {containers[0].name}: it waits for every worker's sshd, then runs "
        f"{'horovodrun (elastic)' if plan.elastic else 'mpirun'}"
    )
    if detach:
        ending = (
            "the containers keep running after it (--keep-running)"
            if keep_running
            else "every container stops when the job ends"
        )
        say(
            f"detached: cluster {plan.cluster_id}; {ending}. Follow with `launcher logs --follow`, see how it went "
            "with `launcher status`, remove it with `launcher stop`"
        )


def dry_run(settings: LaunchSettings, *, push_image: bool = False, say: Say, out: IO[str] = sys.stdout) -> None:
    """Every check a start makes, then the whole plan on `out`; starts nothing (raises LaunchError where a start
    would stop)."""
    plan = settings.plan()
    drivers = connect_all(plan, say)
    plan = check_nodes(plan, drivers, push_image, say, dry_run=True)
    image_id = next((found for driver in drivers if (found := driver.image_id(plan.image))), None)
    out.write(plan.dry_run_report(image_id))
    say("dry run: nothing was started")


def launch(
    settings: LaunchSettings,
    *,
    push_image: bool = False,
    detach: bool = False,
    keep_running: bool = False,
    say: Say,
    relay: Say,
    out: IO[str] = sys.stdout,
) -> int:
    """Runs one training job across the nodes; returns the job's exit status (raises LaunchError on failure).
    Attached, the job's output goes to `out` and the agent's lines to `relay`; a Signalled (the CLI's
    handler for STOP_SIGNALS) while attached removes the cluster on every node."""
    plan = settings.plan()
    drivers = connect_all(plan, say)
    plan = check_nodes(plan, drivers, push_image, say)
    say(plan.describe())

    keys = sshtrust.make_key_pair(f"horovod-stack cluster {plan.cluster_id}")
    containers: list = []
    detached = False
    try:
        for driver in drivers:
            containers.append(driver.start_worker(plan))
            say(f"{driver.node.name}: worker {plan.container_name(driver.node)} started")
        deadline = time.monotonic() + settings.ready_timeout
        if plan.workdir:
            copy_workdir(plan, drivers, containers, say)
        hand_over_trust(plan, drivers, containers, keys, deadline, keep_running, say)
        start_agent(plan, drivers, containers, detach, keep_running, say)
        if detach:
            detached = True
            return 0
        watch = WorkerWatch(plan, containers, settings.restart_workers, say) if plan.elastic else None
        if watch:
            watch.start()
        try:
            end = follow_job(drivers[0], containers[0], out, relay)
        finally:
            if watch:
                watch.stop()
        if end is None or not end.succeeded:
            # The engines see more than the agent: which container was killed, or removed. (Once the job's status
            # is recorded, rank 0's container exits with it: its exit code is the job's, not a kill.)
            rank0_ended_first = end is None
            seen = (
                elastic_failure(plan, drivers, containers, watch, rank0_ended_first)
                if watch
                else dead_worker(drivers, containers, rank0_ended_first)
            )
            cause = seen or (end.cause if end else f"{plan.rank0.name}: rank 0's container ended before the job did")
            if cause:
                raise LaunchError(cause)
        assert end is not None
        say(f"job finished with exit status {end.status}")
        if plan.job_spec().run_dir:
            say(f"results to this machine: launcher results --cluster {plan.cluster_id} --to results")
        return end.status
    except Signalled as stop:
        say(f"{stop}: removing the cluster on every node")
        raise
    finally:
        if not detached:
            with signals_ignored():  # a second Ctrl-C must not cut the cleanup short
                cleanup(drivers, plan.cluster_id, say)
