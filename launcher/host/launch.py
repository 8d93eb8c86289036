"""One launch from the user's machine: connect to every node, check them, start the workers with the cluster's SSH
trust, start the job agent in the rank-0 container, follow it (attached) or not (detached), and clean up.

    settings -> connect_all -> check_nodes (facts, preflight's findings, the image everywhere) -> ClusterPlan
    -> a worker per node (start_worker) -> hand_over_trust -> start_agent -> follow_job -> the exit status, or one
    root cause -> cleanup

The job itself is the agent's (launcher/agent/job.py): readiness, mpirun, the job's end and every worker's stop
happen in the cluster, so a job ends the same way whether this process stays, is stopped (SIGINT/SIGTERM/SIGHUP:
the cluster is removed) or dies outright (the job goes on and every container stops when it ends). Every engine is
a NodeEngine reached through `connect` (NodeDriver.connect, a stand-in in the tests).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import IO

from launcher.core import restart, sshtrust
from launcher.core.imageref import parse_image
from launcher.core.nics import VIRTUAL_NIC_PREFIXES
from launcher.core.protocol import (
    AGENT,
    AGENT_PREFIX,
    CLUSTER_KEY,
    CLUSTER_PRIVATE_DIR,
    CLUSTER_SSH_DIR,
    HOSTKEYS_DIR,
    JOB_LOG,
    JOB_SPEC,
    JOB_STATUS,
    SECRETS_FILE,
    WORKDIR,
    JobEnd,
    Signalled,
    parse_job_end,
)
from launcher.host import images, preflight, ranklogs, workdir
from launcher.host.docker_driver import NodeDriver
from launcher.host.engines import Connect, Container, NodeEngine, NodeError, connecting_line, on_each
from launcher.host.plan import LABEL_CLUSTER, ClusterPlan, Node
from launcher.host.preflight import Finding, NodeFacts, Severity
from launcher.host.settings import LaunchSettings
from launcher.host.signals import signals_ignored

Say = Callable[[str], None]


class LaunchError(RuntimeError):
    """The launch stopped; the message is the one root cause, naming the fix."""


def unforeseen(error: Exception) -> str:
    """One line for an error no part of the launch words itself: its type and its message's first line."""
    return f"unexpected {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def connect_all(settings: LaunchSettings, say: Say, connect: Connect = NodeDriver.connect) -> list[NodeEngine]:
    """Every node's engine, at once; one LaunchError (the first node's that failed) where one does not answer."""

    def reach(node: Node) -> NodeEngine:
        say(connecting_line(node))
        engine = connect(node)
        say(f"{node.name}: engine reachable at {node.engine_url}")
        return engine

    nodes = ClusterPlan.of(settings, cluster_id="-").nodes
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        futures = [pool.submit(reach, node) for node in nodes]
    errors = [future.exception() for future in futures if future.exception()]
    if errors:
        raise LaunchError(str(errors[0]))
    return [future.result() for future in futures]


# --- the checks before a start ------------------------------------------------------------------------------------
def engine_facts(settings: LaunchSettings, engine: NodeEngine) -> NodeFacts:
    """What a node's engine says without starting anything: its version, the stack's clusters, the image."""
    containers = engine.cluster_containers()
    running = sorted({c.labels.get(LABEL_CLUSTER, "?") for c in containers if c.running})
    return NodeFacts(
        node=engine.node.name,
        engine_url=engine.node.engine_url,
        rank0=engine.node.name == settings.nodes[0],
        version=engine.version(),
        host_name=engine.host_name(),
        running_clusters=tuple(running),
        finished_clusters=tuple(sorted({c.labels.get(LABEL_CLUSTER, "?") for c in containers} - set(running))),
        image_id=engine.image_id(settings.image),
    )


def host_facts(plan: ClusterPlan, engine: NodeEngine, facts: NodeFacts) -> NodeFacts:
    """The node as its workers will see it, from short-lived containers of the image (which must be there): its
    NICs, addresses and port, what every node's name resolves to there, the GPUs and the --mount folders. (The plan
    is the settings' alone: what the checks find is not known yet.)"""
    settings = plan.settings
    node = engine.node
    names = tuple(other.name for other in plan.nodes)
    gpu_request = plan.gpu_request(node)
    binds = settings.job.binds
    return replace(
        facts,
        view=engine.host_view(settings.image, settings.job.ssh_port, resolve=names),
        resolve=names,
        gpu_request=gpu_request,
        gpu_problem=engine.gpu_problem(settings.image, gpu_request) if gpu_request else None,
        missing_bind=engine.missing_bind(settings.image, binds) if binds else None,
    )


def refuse_on(findings: list[Finding], say: Say) -> None:
    """Says the notes and warnings; raises the first blocking finding as the launch's one root cause."""
    for finding in findings:
        if finding.severity in (Severity.NOTE, Severity.WARNING):
            say(finding.line())
    stop = preflight.blocking(findings)
    if stop:
        raise LaunchError(stop[0].line())


def check_nodes(
    settings: LaunchSettings, engines: list[NodeEngine], say: Say, dry_run: bool = False
) -> tuple[ClusterPlan, list[Finding]]:
    """Every check a start makes before any container starts, then the plan with what the checks found, and the
    findings. A start refuses on the first blocking finding, before anything is copied or started; the image is
    copied or pulled to the nodes that lack it. A dry run copies nothing and refuses nothing: it returns every
    finding (a node that lacks the image is named, and its host checks wait until it has it)."""
    findings: list[Finding] = []

    def review(found: list[Finding]) -> None:
        findings.extend(found)
        if not dry_run:
            refuse_on(found, say)

    facts = on_each(engines, lambda engine: engine_facts(settings, engine))
    coming = image_coming(settings)
    # A cluster still running anywhere is named before any node's image: it is the first thing to fix.
    first = [finding for fact in facts for finding in preflight.check_node(settings, fact, coming)]
    review(sorted(first, key=lambda finding: finding.check != "cluster"))
    if dry_run:
        present = [fact for fact in facts if fact.image_id]
        if settings.push_image and len(present) < len(facts):  # the copy's source must have it, and the same one
            engine, image_id = this_machine(settings.image)
            source = NodeFacts(engine.node.name, engine.node.engine_url, image_id=image_id)
            review(preflight.push_source_findings(settings, source))
            present += [source] if source.image_id else []
        review(preflight.check_cluster(settings, present))
    else:
        facts = ensure_image_everywhere(settings, engines, facts, say)
    unchecked = ClusterPlan.of(settings, cluster_id="-")
    checked = on_each(
        list(zip(engines, facts, strict=True)),
        lambda engine_fact: host_facts(unchecked, *engine_fact) if engine_fact[1].image_id else engine_fact[1],
    )
    for fact in checked:
        if fact.image_id is None:
            say(f"{fact.node}: port, NIC and GPU checks run once the image is there")
        else:
            review(preflight.host_findings(settings, fact))
    review(preflight.naming_findings(settings, checked))
    plan = ClusterPlan.of(settings, found=preflight.found_in(settings, checked))
    job = settings.job
    for fact in checked:
        if fact.view is None:
            continue
        nic = plan.node_nic(Node(fact.node, fact.engine_url))
        summary = f", NIC {nic} in {job.network_interface}" if nic else ""
        if job.network_interface and not nic:
            summary = f", NIC {job.network_interface} present"
        say(f"{fact.node}: port {job.ssh_port} free{summary}")
    if not job.network_interface and len(settings.nodes) > 1:
        subnets = plan.found.excluded_subnets
        say(
            f"no NIC pinned: Open MPI and NCCL leave out {', '.join(f'{prefix}*' for prefix in VIRTUAL_NIC_PREFIXES)} "
            f"({', '.join(subnets) or 'no such subnet here'}); pin one with --network-interface if a node has more "
            "than one real NIC"
        )
    return plan, findings


def image_coming(settings: LaunchSettings) -> str | None:
    """How a start brings the image to a node that lacks it; None: it does not (a missing image blocks)."""
    if settings.push_image:
        return "copies it there from this machine"
    reference = parse_image(settings.image)
    return f"pulls it from {reference.source}" if reference.pulled else None


def this_machine(image: str) -> tuple[NodeEngine, str | None]:
    """This machine's own engine (where --push-image copies from) and its ID of `image`, or one LaunchError."""
    try:
        engine = NodeDriver.local()
        return engine, engine.image_id(image)
    except NodeError as error:
        raise LaunchError(f"--push-image: {error}") from None


def ensure_image_everywhere(
    settings: LaunchSettings, engines: list[NodeEngine], facts: list[NodeFacts], say: Say
) -> list[NodeFacts]:
    """The same image on every node: pulled where IMAGE names a registry, copied from this machine's engine where
    --push-image asks for it. Returns the facts with each node's image ID as it is now."""
    image = settings.image
    missing = [engine for engine, fact in zip(engines, facts, strict=True) if fact.image_id is None]
    if missing and settings.push_image:
        source, source_image = this_machine(image)
        here = NodeFacts(source.node.name, source.node.engine_url, image_id=source_image)
        refuse_on(preflight.push_source_findings(settings, here), say)
        images.push_everywhere(source, missing, image, say)
    elif missing:
        images.pull_everywhere(missing, image, say)
    if missing:
        facts = [replace(fact, image_id=engine.image_id(image)) for engine, fact in zip(engines, facts, strict=True)]
    still_missing = [fact.node for fact in facts if fact.image_id is None]
    if still_missing:
        raise LaunchError(f"{still_missing[0]}: image {image} is still missing after the copy; load it there by hand")
    refuse_on(preflight.check_cluster(settings, facts), say)
    say(f"image {image} ({(facts[0].image_id or '')[7:19]}) is the same on all {len(engines)} nodes")
    return facts


# --- the cluster --------------------------------------------------------------------------------------------------
def hand_over_trust(
    plan: ClusterPlan,
    engines: list[NodeEngine],
    containers: list[Container],
    keys: sshtrust.KeyPair,
    deadline: float,
    say: Say,
) -> None:
    """The cluster's public key to every worker; to rank 0's container the private key, every worker's host key (as
    the agent pins them) and the job spec the agent runs."""
    authorized = sshtrust.tar_files({"authorized_keys": (keys.public.encode() + b"\n", 0o600)})

    def authorize(worker: tuple[NodeEngine, Container]) -> tuple[str, str]:
        engine, container = worker
        engine.put_files(container.id, CLUSTER_SSH_DIR, authorized)
        return plan.mpi_host(engine.node), wait_for_host_key(engine, container, deadline)

    host_keys = dict(on_each(list(zip(engines, containers, strict=True)), authorize))
    rank0, container = engines[0], containers[0]
    private = {PurePosixPath(CLUSTER_KEY).name: (keys.private, 0o600)}
    if plan.settings.secret_values:  # the agent reads and removes it before the job runs
        private[PurePosixPath(SECRETS_FILE).name] = (json.dumps(plan.settings.secret_values).encode(), 0o600)
    rank0.put_files(container.id, CLUSTER_PRIVATE_DIR, sshtrust.tar_files(private))
    rank0.put_files(
        container.id,
        HOSTKEYS_DIR,
        sshtrust.tar_files({f"{host}.pub": (f"{key}\n".encode(), 0o644) for host, key in host_keys.items()}),
    )
    spec = PurePosixPath(JOB_SPEC)
    rank0.put_files(
        container.id,
        str(spec.parent),
        sshtrust.tar_files({spec.name: (plan.job_spec().to_json().encode(), 0o644)}),
    )
    say(
        "SSH trust handed over: cluster key in every worker; rank 0 holds the private key, the workers' host keys "
        "and the job"
    )


def copy_workdir(folder: str, engines: list[NodeEngine], containers: list[Container], say: Say) -> None:
    """The user's code folder to WORKDIR in every worker container, through the Docker API (no NFS needed)."""
    packed = workdir.pack(Path(folder))
    on_each(
        list(zip(engines, containers, strict=True)),
        lambda worker: worker[0].put_files(worker[1].id, WORKDIR, packed.archive),
    )
    say(f"code: {folder} copied to {WORKDIR} on {len(engines)} node(s) ({len(packed.archive) / 1024:.0f} KB)")
    skipped = workdir.skipped_line(packed.skipped)
    if skipped:
        say(f"code: {skipped}")


def wait_for_host_key(engine: NodeEngine, container: Container, deadline: float) -> str:
    node = engine.node.name
    while True:
        content = engine.read_file(container.id, f"{HOSTKEYS_DIR}/{node}.pub")
        if content:
            return " ".join(content.split()[:2])
        problem = engine.worker_problem(container.id)
        if problem:
            raise LaunchError(f"{node}: {problem}")
        if time.monotonic() > deadline:
            raise LaunchError(f"{node}: the worker made no SSH host key in time; see `launcher logs --node {node}`")
        time.sleep(0.5)


FOLLOW_ATTEMPTS = 5
"""How often the launcher re-attaches to a running job whose log stream broke (an engine connection dropped)."""


def follow_job(
    engine: NodeEngine, container: Container, out: IO[str], relay: Say, ranks: Collection[int] | None = None
) -> JobEnd | None:
    """Streams the agent's log from rank 0's container until the job ends: the job's output to `out` (only the lines
    of `ranks` where given: --ranks), the agent's own lines to `relay`. Returns how the job ended, or None when rank
    0's container ended first."""
    received, pending = 0, b""
    for _ in range(FOLLOW_ATTEMPTS):
        _, stream = engine.exec_stream(container.id, [*AGENT, "follow", "--from", str(received)])
        for chunk in stream:
            received += len(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                text = line.decode(errors="replace")
                if text.startswith(AGENT_PREFIX):
                    relay(text)
                elif ranklogs.in_view(text, ranks):
                    out.write(text + "\n")
            out.flush()
        end = parse_job_end(engine.read_file(container.id, JOB_STATUS))
        if end is not None or engine.worker_problem(container.id):
            break
    text = pending.decode(errors="replace")
    if text and ranklogs.in_view(text, ranks):
        out.write(text)
    return end


class WorkerWatch(threading.Thread):
    """An attached elastic job's eye on the workers other than rank 0's: says when one stops (the job goes on
    without it) and, with restart, starts its container again: same host key and cluster key, so it rejoins at
    the next host discovery. It opens its own engine connections; the main thread's stream the job's output."""

    MAX_RESTARTS = 5

    def __init__(
        self, plan: ClusterPlan, containers: list[Container], say: Say, connect: Connect = NodeDriver.connect
    ) -> None:
        super().__init__(name="worker-watch", daemon=True)
        self.plan, self.restart, self.say, self.connect = plan, plan.settings.job.restart_workers, say, connect
        self.container_ids = {node.name: c.id for node, c in zip(plan.nodes[1:], containers[1:], strict=True)}
        self.lost: dict[str, str] = {}
        """Nodes whose worker is down right now, and why."""
        self.restarts: dict[str, int] = {}
        self.done = threading.Event()

    def run(self) -> None:
        try:
            engines = {node.name: self.connect(node) for node in self.plan.nodes[1:]}
            while not self.done.wait(1):
                for name, container_id in self.container_ids.items():
                    try:
                        self.check(name, engines[name], container_id)
                    except NodeError:  # its engine does not answer now (a silent node): the agent sees the job
                        continue
        except Exception as error:  # the job goes on; only the watching stops
            self.say(f"worker watch stopped: {type(error).__name__}: {error}")

    def check(self, name: str, engine: NodeEngine, container_id: str) -> None:
        loss = engine.lost_reason(container_id)
        if loss is None:
            self.lost.pop(name, None)
            return
        if name not in self.lost:
            self.say(f"{name}: {loss}; the elastic job goes on without it")
        self.lost[name] = str(loss)
        if self.restart and not loss.removed and self.restarts.get(name, 0) < self.MAX_RESTARTS:
            self.restarts[name] = self.restarts.get(name, 0) + 1
            engine.start_again(container_id)
            self.say(
                f"{name}: worker started again (restart {self.restarts[name]} of at most "
                f"{self.MAX_RESTARTS}); it rejoins at the next host discovery"
            )

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=10)


def elastic_failure(
    plan: ClusterPlan,
    engines: list[NodeEngine],
    containers: list[Container],
    watch: WorkerWatch,
    rank0_ended_first: bool,
) -> str | None:
    """The root cause when an elastic job fails: its driver's node lost, or too few nodes left."""
    loss = engines[0].lost_reason(containers[0].id) if rank0_ended_first else None
    if loss:
        return (
            f"{plan.rank0.name}: {loss} during the run; the elastic driver runs on rank 0's node, so the job "
            "ended with it"
        )
    if watch.lost:
        job = plan.settings.job
        lost = "; ".join(f"{name} ({why})" for name, why in sorted(watch.lost.items()))
        minimum = job.spelling.of("elastic_min_workers", job.min_workers)
        return f"the elastic job fell below {minimum} for {job.elastic_timeout} s: lost {lost}"
    return None


def dead_worker(engines: list[NodeEngine], containers: list[Container], rank0_ended_first: bool) -> str | None:
    """A worker killed or removed during the run (rank 0's own exit code is the job's once the job has ended)."""
    start = 0 if rank0_ended_first else 1
    for engine, container in zip(engines[start:], containers[start:], strict=True):
        try:
            loss = engine.lost_reason(container.id)
        except NodeError:  # its engine does not answer (a node gone silent): the agent's cause stands
            continue
        if loss:
            return f"{engine.node.name}: {loss} during the run"
    return None


def cleanup(engines: list[NodeEngine], cluster_id: str, say: Say) -> None:
    def remove(engine: NodeEngine) -> int:
        try:
            return engine.remove_cluster(cluster_id)
        except Exception as error:  # keep cleaning the other nodes
            say(f"{engine.node.name}: cleanup failed ({error}); run `launcher stop` for it")
            return 0

    say(f"cleanup: removed {sum(on_each(engines, remove))} container(s) of cluster {cluster_id}")


def start_agent(plan: ClusterPlan, engines: list[NodeEngine], containers: list[Container], say: Say) -> None:
    settings = plan.settings
    engines[0].exec_detached(containers[0].id, [*AGENT, "run", "--log", JOB_LOG])
    say(
        f"job agent started in {containers[0].name}: it waits for every worker's sshd, then runs "
        f"{'horovodrun (elastic)' if settings.job.elastic else 'mpirun'}"
    )
    if settings.detach:
        ending = (
            "the containers keep running after it (--keep-running)"
            if settings.keep_running
            else "every container stops when the job ends"
        )
        say(
            f"detached: cluster {plan.cluster_id}; {ending}. Follow with `launcher logs --follow`, see how it went "
            "with `launcher status`, remove it with `launcher stop`"
        )
    elif settings.shown_ranks is not None:
        say(
            f"shown here: rank(s) {','.join(map(str, sorted(settings.shown_ranks)))} of the job's output (--ranks); "
            "every rank's while the job runs: `launcher logs --follow --rank N` (or --tee DIR)"
        )


def dry_run(
    settings: LaunchSettings, *, say: Say, out: IO[str] = sys.stdout, connect: Connect = NodeDriver.connect
) -> None:
    """Every check a start makes, then the whole plan on `out`; starts nothing (raises LaunchError where a start
    would stop)."""
    engines = connect_all(settings, say, connect)
    plan, findings = check_nodes(settings, engines, say, dry_run=True)
    out.write("checks:\n" + "".join(f"  {finding.doctor_line()}\n" for finding in findings))
    stop = preflight.blocking(findings)
    if stop:
        raise LaunchError(stop[0].line())
    image_id = next((found for engine in engines if (found := engine.image_id(settings.image))), None)
    out.write(plan.dry_run_report(image_id))
    say("dry run: nothing was started")


def launch(
    settings: LaunchSettings,
    *,
    say: Say,
    relay: Say,
    out: IO[str] = sys.stdout,
    connect: Connect = NodeDriver.connect,
) -> int:
    """Runs one training job across the nodes; returns the job's exit status (raises LaunchError on failure).
    Attached, the job's output goes to `out` and the agent's lines to `relay`; a Signalled (the CLI's
    handler for STOP_SIGNALS) while attached removes the cluster on every node."""
    engines = connect_all(settings, say, connect)
    plan, _ = check_nodes(settings, engines, say)
    say(plan.describe())

    keys = sshtrust.make_key_pair(f"horovod-stack cluster {plan.cluster_id}")
    containers: list[Container] = []
    detached = False
    try:
        containers = on_each(engines, lambda engine: engine.start_worker(plan.worker_container(engine.node)))
        for engine in engines:
            say(f"{engine.node.name}: worker {plan.container_name(engine.node)} started")
        deadline = time.monotonic() + settings.job.ready_timeout
        if settings.job.workdir:
            copy_workdir(settings.job.workdir, engines, containers, say)
        hand_over_trust(plan, engines, containers, keys, deadline, say)
        start_agent(plan, engines, containers, say)
        if settings.detach:
            detached = True
            return 0
        watch = WorkerWatch(plan, containers, say, connect) if settings.job.elastic else None
        if watch:
            watch.start()
        try:
            end = follow_job(engines[0], containers[0], out, relay, settings.shown_ranks)
        finally:
            if watch:
                watch.stop()
        if end is None or not end.succeeded:
            # The engines see more than the agent: which container was killed, or removed. (Once the job's status
            # is recorded, rank 0's container exits with it: its exit code is the job's, not a kill.)
            rank0_ended_first = end is None
            seen = (
                elastic_failure(plan, engines, containers, watch, rank0_ended_first)
                if watch
                else dead_worker(engines, containers, rank0_ended_first)
            )
            cause = seen or (end.cause if end else f"{plan.rank0.name}: rank 0's container ended before the job did")
            if cause and end and settings.job.max_restarts:
                cause = restart.with_why_not(cause, end.cause)
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
                cleanup(engines, plan.cluster_id, say)
