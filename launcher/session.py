"""One launch, start to finish: connect to every node, check them, start the workers with the cluster's SSH
trust, wait until every sshd answers, run mpirun in the rank-0 container, and clean up on every exit path.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker

from launcher import sshtrust, workdir
from launcher.driver import NodeDriver
from launcher.plan import JOB_LOG, LABEL_CLUSTER, WORKDIR, ClusterPlan, Node, command_probe, nic_problem
from launcher.settings import LaunchSettings

Say = Callable[[str], None]


class LaunchError(RuntimeError):
    """The launch stopped; the message is the one root cause, naming the fix."""


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


def check_nodes(plan: ClusterPlan, drivers: list[NodeDriver], push_image: bool, say: Say) -> None:
    node_list = ",".join(n.name for n in plan.nodes)
    for driver in drivers:
        containers = driver.cluster_containers()
        running = [c for c in containers if c.status == "running"]
        if running:
            cluster = running[0].labels.get(LABEL_CLUSTER)
            raise LaunchError(f"{driver.node.name}: cluster {cluster} is still running; stop it first with "
                              f"`launcher stop --nodes {node_list} --cluster {cluster}`")
        for cluster in sorted({c.labels.get(LABEL_CLUSTER) for c in containers}):
            say(f"{driver.node.name}: finished cluster {cluster} is kept for `launcher status` and `launcher logs`; "
                f"`launcher stop --nodes {node_list} --cluster {cluster}` removes it")
    ensure_image_everywhere(plan, drivers, push_image, say)
    for driver in drivers:
        view = driver.host_view(plan.image, plan.ssh_port)
        problem = nic_problem(plan.network_interface, view.nics)
        if problem:  # else mpirun fails after every container started, in paragraphs that never name the NIC
            raise LaunchError(f"{driver.node.name}: {problem}")
        if view.port_taken:
            raise LaunchError(f"{driver.node.name}: port {plan.ssh_port} is already in use there; free it or pass "
                              "--ssh-port with a free port")
        nic = f", NIC {plan.network_interface} present" if plan.network_interface else ""
        say(f"{driver.node.name}: port {plan.ssh_port} free{nic}")


def ensure_image_everywhere(plan: ClusterPlan, drivers: list[NodeDriver], push_image: bool, say: Say) -> None:
    missing = [driver for driver in drivers if driver.image_id(plan.image) is None]
    if missing and not push_image:
        raise LaunchError(f"{missing[0].node.name}: image {plan.image} is not there; pass --push-image to copy it "
                          "from this machine's engine, or load it on that node")
    if missing:
        try:
            source = NodeDriver(Node("this machine", "local"), docker.from_env())
            if source.image_id(plan.image) is None:
                raise LaunchError(f"--push-image: this machine's engine has no image {plan.image} either; build it "
                                  "with scripts/build-images.sh")
        except docker.errors.DockerException as error:
            raise LaunchError(f"--push-image: this machine's Docker engine is not reachable ({error})") from None
        for driver in missing:
            driver.push_image_from(source, plan.image, say)
    ids = {driver.node.name: driver.image_id(plan.image) for driver in drivers}
    still_missing = [name for name, image_id in ids.items() if image_id is None]
    if still_missing:
        raise LaunchError(f"{still_missing[0]}: image {plan.image} is still missing after the copy; load it there by hand")
    if len(set(ids.values())) > 1:
        listing = ", ".join(f"{name} {image_id[7:19]}" for name, image_id in ids.items())
        raise LaunchError(f"image {plan.image} differs between nodes ({listing}); mismatched Horovod/MPI builds "
                          "hang, so load one image on every node (docker save | docker load)")
    say(f"image {plan.image} ({next(iter(ids.values()))[7:19]}) is the same on all {len(drivers)} nodes")


def resolve_for_open_mpi(plan: ClusterPlan, containers: list) -> ClusterPlan:
    """Adds the addresses of nodes whose names Open MPI refuses, as rank 0's container resolves them."""
    addresses = []
    for node in plan.needs_addresses():
        found = containers[0].exec_run(["getent", "ahostsv4", node.name], user="mpiuser")
        if found.exit_code != 0 or not found.output.split():
            raise LaunchError(f"{node.name} does not resolve on {plan.rank0.name}; add it to DNS or /etc/hosts on "
                              "every node")
        addresses.append((node.name, found.output.split()[0].decode()))
    return dataclasses.replace(plan, addresses=tuple(addresses))


def hand_over_trust(plan: ClusterPlan, drivers: list[NodeDriver], containers: list, keys: sshtrust.KeyPair,
                    deadline: float, say: Say) -> None:
    authorized = sshtrust.tar_files({"authorized_keys": (keys.public.encode() + b"\n", 0o600)})
    host_keys = {}
    for driver, container in zip(drivers, containers):
        driver.put_files(container, "/cluster/ssh", authorized)
        host_keys[driver.node.name] = wait_for_host_key(driver, container, deadline)
    rank0_files = {
        ".ssh/id_ed25519": (keys.private, 0o600),
        ".ssh/config": (plan.ssh_config().encode(), 0o600),
        ".ssh/known_hosts": (plan.known_hosts(host_keys).encode(), 0o600),
        "hostfile": (plan.hostfile().encode(), 0o644),
    }
    drivers[0].put_files(containers[0], "/home/mpiuser", sshtrust.tar_files(rank0_files))
    say("SSH trust handed over: cluster key in every worker, host keys pinned in rank 0's known_hosts")


def copy_workdir(plan: ClusterPlan, drivers: list[NodeDriver], containers: list, say: Say) -> None:
    """The user's code folder to WORKDIR in every worker container, through the Docker API (no NFS needed)."""
    archive = workdir.archive(Path(plan.workdir))
    for driver, container in zip(drivers, containers):
        driver.put_files(container, WORKDIR, archive)
    say(f"code: {plan.workdir} copied to {WORKDIR} on {len(drivers)} node(s) ({len(archive) / 1024:.0f} KB)")


def check_command(plan: ClusterPlan, drivers: list[NodeDriver], containers: list) -> None:
    """Every rank must be able to start the command; else one line naming the node and the fix, before mpirun."""
    cwd = WORKDIR if plan.workdir else "/home/mpiuser"
    for driver, container in zip(drivers, containers):
        probe = container.exec_run(command_probe(plan.command), user="mpiuser", workdir=cwd)
        if probe.exit_code != 0:
            why = probe.output.decode(errors="replace").strip().splitlines()[-1]
            raise LaunchError(f"{driver.node.name}: cannot start `{' '.join(plan.command)}` in {cwd}: {why}; "
                              "pass --workdir with the folder that holds your code, or build an image "
                              "FROM horovod-stack:latest that has it")


def wait_for_host_key(driver: NodeDriver, container, deadline: float) -> str:
    while True:
        content = driver.read_file(container, f"/cluster/hostkeys/{driver.node.name}.pub")
        if content:
            return " ".join(content.split()[:2])
        problem = driver.worker_problem(container)
        if problem:
            raise LaunchError(f"{driver.node.name}: {problem}")
        if time.monotonic() > deadline:
            raise LaunchError(f"{driver.node.name}: the worker made no SSH host key in time; see `launcher logs "
                              f"--node {driver.node.name}`")
        time.sleep(0.5)


def wait_until_ready(plan: ClusterPlan, drivers: list[NodeDriver], containers: list, deadline: float,
                     say: Say) -> None:
    """Readiness as mpirun will need it: rank 0's container logs into every node's worker over ssh."""
    pending = list(zip(drivers, containers))
    ready = 0
    while pending:
        still = []
        for driver, container in pending:
            problem = driver.worker_problem(container)
            if problem:
                hint = (f"; is port {plan.ssh_port} taken there? pass --ssh-port" if "Address already in use"
                        in problem else "")
                raise LaunchError(f"{driver.node.name}: {problem}{hint}")
            check = containers[0].exec_run(["ssh", plan.mpi_host(driver.node), "true"], user="mpiuser")
            if check.exit_code == 0:
                ready += 1
                say(f"{driver.node.name}: sshd answers on port {plan.ssh_port} ({ready}/{len(plan.nodes)} ready)")
            else:
                still.append((driver, container))
        pending = still
        if pending and time.monotonic() > deadline:
            names = ", ".join(driver.node.name for driver, _ in pending)
            raise LaunchError(f"{names}: sshd did not answer rank 0 on port {plan.ssh_port} in time; check that "
                              f"rank 0 reaches those hosts by name and that the port is open between nodes")
        if pending:
            time.sleep(1)


def run_job(plan: ClusterPlan, drivers: list[NodeDriver], containers: list, out) -> int:
    exec_id, stream = drivers[0].exec_stream(containers[0], plan.job_argv())
    for chunk in stream:
        out.write(chunk.decode(errors="replace"))
        out.flush()
    code = drivers[0].exec_exit_code(exec_id)
    return 1 if code is None else code


class WorkerWatch(threading.Thread):
    """An attached elastic job's eye on the workers other than rank 0's: says when one stops (the job goes on
    without it) and, with restart, starts its container again: same host key and cluster key, so it rejoins at
    the next host discovery. It opens its own engine connections; the main thread's stream the job's output."""

    MAX_RESTARTS = 5

    def __init__(self, plan: ClusterPlan, containers: list, restart: bool, say: Say) -> None:
        super().__init__(name="worker-watch", daemon=True)
        self.plan, self.restart, self.say = plan, restart, say
        self.container_ids = {node.name: c.id for node, c in zip(plan.nodes[1:], containers[1:])}
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
        problem = driver.worker_problem(container)
        if problem is None:
            self.lost.pop(name, None)
            return
        if name not in self.lost:
            self.say(f"{name}: {problem}; the elastic job goes on without it")
        self.lost[name] = problem
        if self.restart and "removed" not in problem and self.restarts.get(name, 0) < self.MAX_RESTARTS:
            self.restarts[name] = self.restarts.get(name, 0) + 1
            container.start()
            self.say(f"{name}: worker started again (restart {self.restarts[name]} of at most "
                     f"{self.MAX_RESTARTS}); it rejoins at the next host discovery")

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=10)


def elastic_failure(plan: ClusterPlan, drivers: list[NodeDriver], containers: list,
                    watch: WorkerWatch) -> str | None:
    """The root cause when an elastic job fails: its driver's node lost, or too few nodes left."""
    problem = drivers[0].worker_problem(containers[0])
    if problem:
        return (f"{plan.rank0.name}: {problem} during the run; the elastic driver runs on rank 0's node, so the job "
                "ended with it")
    if watch.lost:
        lost = "; ".join(f"{name} ({why})" for name, why in sorted(watch.lost.items()))
        return (f"the elastic job fell below --min-nodes {plan.elastic_min_nodes} for {plan.elastic_timeout} s: "
                f"lost {lost}")
    return None


def dead_worker(drivers: list[NodeDriver], containers: list) -> str | None:
    for driver, container in zip(drivers, containers):
        problem = driver.worker_problem(container)
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


def launch(settings: LaunchSettings, *, push_image: bool = False, detach: bool = False, keep_running: bool = False,
           say: Say, out=sys.stdout) -> int:
    """Runs one training job across the nodes; returns the job's exit status (raises LaunchError on failure)."""
    plan = settings.plan()
    say(plan.describe())
    started = time.monotonic()
    drivers = connect_all(plan, say)
    check_nodes(plan, drivers, push_image, say)

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
        plan = resolve_for_open_mpi(plan, containers)
        hand_over_trust(plan, drivers, containers, keys, deadline, say)
        wait_until_ready(plan, drivers, containers, deadline, say)
        check_command(plan, drivers, containers)
        say(f"all {len(drivers)} nodes ready in {time.monotonic() - started:.1f} s; running "
            f"{'horovodrun (elastic)' if plan.elastic else 'mpirun'} in {containers[0].name}")
        if detach:
            drivers[0].exec_detached(containers[0], ["bash", "-c", plan.detached_job_script(keep_running)])
            detached = True
            ending = ("the containers keep running after it (--keep-running)" if keep_running else
                      "every container stops when the job ends")
            say(f"detached: cluster {plan.cluster_id}; {ending}. Follow with `launcher logs --follow`, see how it "
                "went with `launcher status`, remove it with `launcher stop`")
            return 0
        if plan.elastic:
            watch = WorkerWatch(plan, containers, settings.restart_workers, say)
            watch.start()
            try:
                status = run_job(plan, drivers, containers, out)
            finally:
                watch.stop()
            cause = elastic_failure(plan, drivers, containers, watch) if status != 0 else None
        else:
            status = run_job(plan, drivers, containers, out)
            cause = dead_worker(drivers, containers) if status != 0 else None
        if cause:
            raise LaunchError(cause)
        say(f"job finished with exit status {status}")
        return status
    except KeyboardInterrupt:
        say("interrupted: stopping the cluster")
        raise
    finally:
        if not detached:
            cleanup(drivers, plan.cluster_id, say)

