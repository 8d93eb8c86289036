"""The launch's one root cause: LaunchError (the launch stopped; its message is the one line naming the fix), the
line for an error nothing words itself (unforeseen), and, when a followed job did not succeed, what the engines saw
(a worker container killed or removed, the elastic driver's node lost, too few nodes left) before the agent's own
cause (root_cause).
"""

from __future__ import annotations

from launcher.core.jobend import JobEnd
from launcher.host.engines.node_engine import Container, NodeEngine, NodeError
from launcher.host.planning.plan import ClusterPlan
from launcher.host.running.follow import WorkerWatch


class LaunchError(RuntimeError):
    """The launch stopped; the message is the one root cause, naming the fix."""


def unforeseen(error: Exception) -> str:
    """One line for an error no part of the launch words itself: its type and its message's first line."""
    return f"unexpected {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def root_cause(
    plan: ClusterPlan,
    engines: list[NodeEngine],
    containers: list[Container],
    end: JobEnd | None,
    watch: WorkerWatch | None,
) -> str | None:
    """Why a followed job failed, in one line, when it did not succeed (end None: rank 0's container ended before the
    job did). The engines see more than the agent: which container was killed, or removed. (Once the job's status is
    recorded, rank 0's container exits with it: its exit code is the job's, not a kill.) None when the job succeeded,
    or failed with no cause to name (its status is its own)."""
    if end is not None and end.succeeded:
        return None
    rank0_ended_first = end is None
    seen = (
        elastic_failure(plan, engines, containers, watch, rank0_ended_first)
        if watch
        else dead_worker(engines, containers, rank0_ended_first)
    )
    if end is None:
        return seen or f"{plan.rank0.name}: rank 0's container ended before the job did"
    return end.root_cause(seen)


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
        return plan.settings.job.fell_below("; ".join(f"{name} ({why})" for name, why in sorted(watch.lost.items())))
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
