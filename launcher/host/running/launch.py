"""One launch from the user's machine: connect to every node, check them, start the workers with the cluster's SSH
trust, start the job agent in the rank-0 container, follow it (attached) or not (detached), and clean up.

    settings -> connect_all -> check_nodes (facts, preflight's findings, the image everywhere) -> ClusterPlan
    -> a worker per node (start_worker) -> hand_over_trust -> start_agent -> follow_job -> the exit status, or one
    root cause -> cleanup

This module holds that order; each step is its own module's: the checks (nodechecks.py), the code folder and the SSH
trust handed to the workers (handover.py), the job followed and an elastic job's workers watched (follow.py), and the
one root cause, LaunchError's (rootcause.py).

The job itself is the agent's (launcher/agent/job.py): readiness, mpirun, the job's end and every worker's stop
happen in the cluster, so a job ends the same way whether this process stays, is stopped (SIGINT/SIGTERM/SIGHUP:
the cluster is removed) or dies outright (the job goes on and every container stops when it ends). Every engine is
a NodeEngine reached through `connect` (NodeDriver.connect, a stand-in in the tests).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import IO

from launcher.core import sshtrust
from launcher.core.protocol import AGENT, JOB_LOG, Signalled
from launcher.host.engines.docker_driver import NodeDriver
from launcher.host.engines.node_engine import Connect, Container, NodeEngine, connecting_line, on_each
from launcher.host.planning import preflight
from launcher.host.planning.plan import ClusterPlan, Node, nodes_of
from launcher.host.planning.settings import LaunchSettings
from launcher.host.running.follow import WorkerWatch, follow_job
from launcher.host.running.handover import copy_workdir, hand_over_trust
from launcher.host.running.nodechecks import check_nodes
from launcher.host.running.rootcause import LaunchError, root_cause
from launcher.host.running.signals import signals_ignored

Say = Callable[[str], None]


def connect_all(settings: LaunchSettings, say: Say, connect: Connect = NodeDriver.connect) -> list[NodeEngine]:
    """Every node's engine, at once; one LaunchError (the first node's that failed) where one does not answer."""

    def reach(node: Node) -> NodeEngine:
        say(connecting_line(node))
        engine = connect(node)
        say(f"{node.name}: engine reachable at {node.engine_url}")
        return engine

    nodes = nodes_of(settings)
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        futures = [pool.submit(reach, node) for node in nodes]
    errors = [future.exception() for future in futures if future.exception()]
    if errors:
        raise LaunchError(str(errors[0]))
    return [future.result() for future in futures]


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
        cause = root_cause(plan, engines, containers, end, watch)
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
