"""Clusters already started, as the user's machine sees them through each node's engine: `launcher status`, `logs`,
`stacks`, `results` and `stop`. Each reads or removes what the containers hold (the job's status and log in rank
0's container, the run folder in the shared folder); none of them needs the client that started the job.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.frameworks import FRAMEWORKS
from app.gpu import FRAMEWORK_LABEL
from launcher.core.protocol import (
    AGENT,
    DEFAULT_IMAGE,
    JOB_LOG,
    JOB_RESTARTS,
    JOB_STALL,
    JOB_STATUS,
    KEPT_JOB_LOG,
)
from launcher.host.engines import streams
from launcher.host.engines.node_engine import Container, NodeEngine
from launcher.host.planning.plan import LABEL_CLUSTER, LABEL_IMAGE, LABEL_METRICS, LABEL_RANKS, LABEL_ROLE, run_dir
from launcher.host.planning.settings import LaunchSettings
from launcher.host.running import jobstate, results


class ClusterError(RuntimeError):
    """Nothing to show or take: the message names what is missing and what to run."""


def stop(engines: list[NodeEngine], cluster: str | None) -> Iterator[str]:
    """Removes the stack's containers (one cluster's, or all) on every node; a line per node."""
    for engine in engines:
        yield f"{engine.node.name}: removed {engine.remove_cluster(cluster)} container(s)"


@dataclass(frozen=True)
class Member:
    node: str
    container: Container


def status(engines: Sequence[NodeEngine]) -> Iterator[str]:
    """Each cluster's job (running: epoch, accuracy, throughput; succeeded; failed, with its cause) and its
    containers on every node, or that there is none."""
    found = False
    for engine in engines:
        for container in engine.cluster_containers():
            if container.labels.get(LABEL_ROLE) != "rank0":
                continue
            found = True
            cluster = container.labels.get(LABEL_CLUSTER, "?")
            members = [Member(e.node.name, c) for e in engines for c in e.cluster_containers(cluster)]
            state = jobstate.describe(
                container.state,
                engine.read_file(container.id, JOB_STATUS),
                [member.container.state for member in members],
                metrics=engine.read_file(container.id, metrics_file(container, cluster)),
                stall=engine.read_file(container.id, JOB_STALL),
                restarts_made=engine.read_file(container.id, JOB_RESTARTS),
            )
            yield f"cluster {cluster}: {state}"
            if container.labels.get(LABEL_IMAGE):
                framework = container.labels.get(FRAMEWORK_LABEL)
                yield f"  image {container.labels[LABEL_IMAGE]}{f' ({framework})' if framework else ''}"
            for member in members:
                member_state = member.container.state
                ended = "" if member_state.running else f" (exit status {member_state.exit_code})"
                yield (
                    f"  {member.node}: {member.container.name} role={member.container.labels.get(LABEL_ROLE)} "
                    f"ranks={member.container.labels.get(LABEL_RANKS, '?')} {member.container.status}{ended}"
                )
    if not found:
        yield "no cluster on " + ", ".join(engine.node.name for engine in engines)


def metrics_file(container: Container, cluster: str) -> str:
    """Where the job's metrics are in rank 0's container: as its label records them (the bundled trainer's
    --metrics-file or --run-dir, laid out once by the plan), else the cluster's run folder's."""
    return container.labels.get(LABEL_METRICS) or f"{run_dir(cluster)}/metrics.jsonl"


def reading_image(engine: NodeEngine, wanted: str | None) -> str:
    """The image whose short-lived containers read `engine`'s shared folder (any of the stack's images can): the one
    asked for (--image, IMAGE in .env), else one its clusters ran (their record, LABEL_IMAGE), else the first of the
    stack's images the node holds, so that no engine is asked to pull one; the default where it holds none."""
    if wanted:
        return wanted
    recorded = [container.labels.get(LABEL_IMAGE) for container in engine.cluster_containers()]
    stack = [framework.image for framework in FRAMEWORKS]
    return next((image for image in (*recorded, *stack) if image and engine.image_id(image)), DEFAULT_IMAGE)


def fetch_results(
    engines: Sequence[NodeEngine], image: str | None, shared_dir: str, cluster: str | None, to: Path, checkpoints: bool
) -> tuple[results.Run, list[str]]:
    """Copies a run's folder (the cluster's, or the newest) from the node that holds it into `to`; `image` reads
    the shared folder (None: each node's reading_image)."""
    try:
        run = results.choose(results.runs_on(engines, lambda engine: reading_image(engine, image), shared_dir), cluster)
    except ValueError as error:
        raise ClusterError(str(error)) from None
    engine = next(e for e in engines if e.node.name == run.node)
    to.mkdir(parents=True, exist_ok=True)
    return run, results.fetch(engine, reading_image(engine, image), shared_dir, run.name, to, checkpoints)


def stacks(engines: list[NodeEngine], cluster: str | None, native: bool) -> tuple[Iterator[bytes], NodeEngine, str]:
    """Every rank's stack now, from the job agent in the running cluster's rank-0 container: its output stream,
    and how to ask for its exit code afterwards (the engine and the exec's ID)."""
    rank0 = [
        (engine, container)
        for engine in engines
        for container in engine.cluster_containers(cluster)
        if container.labels.get(LABEL_ROLE) == "rank0" and container.running
    ]
    if not rank0:
        raise ClusterError("no running cluster on these nodes: `launcher status` lists the clusters")
    engine, container = rank0[0]
    exec_id, stream = engine.exec_stream(container.id, [*AGENT, "stacks", *(["--native"] if native else [])])
    return stream, engine, exec_id


def node_problem(settings: LaunchSettings, node: str | None) -> str | None:
    """Why `node` (logs --node) is not one to show; None if it is, or if none is named (rank 0's)."""
    if node is None or node in settings.nodes:
        return None
    return f"--node {node} is not one of --nodes {','.join(settings.nodes)}"


def logs(
    engines: Sequence[NodeEngine], node: str | None, follow: bool, tail: int | None, image: str | None, shared_dir: str
) -> tuple[Iterator[bytes], Iterator[bytes], str | None]:
    """A worker's own output (`node`'s, default rank 0's), and the job's (rank 0's container's, its last `tail` lines
    when given, also after the job ended, and with `follow`, streamed until the job ends; nothing before a job).
    Once rank 0's node holds no container of the stack, the job's output as its run folder kept it (the newest run
    in the nodes' shared folder, read with `image`, None: each node's reading_image), with a note saying so; the third
    value is that note, else None."""
    rank0 = engines[0]
    engine = next(engine for engine in engines if engine.node.name == node) if node else rank0
    if not rank0.cluster_containers():
        run, holder = last_run(engines, image, shared_dir)
        note = (
            f"the job's containers are gone: its output as run {run.name} kept it "
            f"({run.node}: runs/{run.name}/{KEPT_JOB_LOG} in {shared_dir}); the workers' own output went with them"
        )
        return iter(()), kept_job_log(holder, reading_image(holder, image), shared_dir, run, tail), note

    def own() -> Iterator[bytes]:
        yield from engine.logs(stack_container(engine).id)

    def job() -> Iterator[bytes]:
        container = stack_container(rank0)
        job_log = rank0.stream_file(container.id, JOB_LOG)
        if job_log is not None and container.running and follow:  # the agent's follower returns once the job ended
            yield from rank0.exec_stream(container.id, [*AGENT, "follow"])[1]
        elif job_log is not None:  # ended jobs keep their output too
            yield from job_log if tail is None else [streams.tail_lines(job_log, tail)]

    return own(), job(), None


def last_run(engines: Sequence[NodeEngine], image: str | None, shared_dir: str) -> tuple[results.Run, NodeEngine]:
    """The newest run folder in the nodes' shared folder, which kept its job's output, and the engine of its node;
    one ClusterError saying where an ended job's output goes when there is none such."""
    runs = results.runs_on(engines, lambda engine: reading_image(engine, image), shared_dir)
    run = results.choose(runs, None) if runs else None
    holder = next((engine for engine in engines if run and engine.node.name == run.node), None)
    kept = holder and run and holder.run_entries(reading_image(holder, image), shared_dir, run.name)
    if run is None or holder is None or KEPT_JOB_LOG not in (kept or []):
        newest = f" (the newest run, {run.name} on {run.node}, kept none)" if run else ""
        raise ClusterError(
            f"{engines[0].node.name}: no container of the stack there, and no job's output in the shared folder "
            f"({shared_dir}){newest}: an ended job's output is kept there as runs/CLUSTER/{KEPT_JOB_LOG} until that "
            "volume is removed (`launcher results` copies a run folder to this machine)"
        )
    return run, holder


def kept_job_log(
    engine: NodeEngine, image: str, shared_dir: str, run: results.Run, tail: int | None
) -> Iterator[bytes]:
    """The job's output its run folder kept, streamed (its last `tail` lines when given)."""
    chunks = streams.file_in_archive(engine.run_archive(image, shared_dir, f"{run.name}/{KEPT_JOB_LOG}"))
    yield from chunks if tail is None else [streams.tail_lines(chunks, tail)]


def stack_container(engine: NodeEngine) -> Container:
    """The stack's container on the node, or one ClusterError saying there is none."""
    containers = engine.cluster_containers()
    if not containers:
        raise ClusterError(f"{engine.node.name}: no container of the stack there; start one with `launcher start`")
    return containers[0]
