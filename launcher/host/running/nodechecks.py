"""The checks a start (and --dry-run) makes on the nodes before any container starts, in order: what each node's
engine says without starting anything (engine_facts), a cluster still running, the image brought to every node that
lacks it (pulled, or copied from this machine with --push-image) and the same everywhere, then the node as its
workers will see it (host_facts: port, NICs, names, GPUs held to the needs of the image's framework, --mount
folders), each finding judged by preflight.py (pure); and the plan with what the checks found (check_nodes). doctor
reads the same facts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from app.gpu import build_of
from launcher.core.nics import VIRTUAL_NIC_PREFIXES
from launcher.host.engines import images
from launcher.host.engines.docker_driver import NodeDriver
from launcher.host.engines.node_engine import NodeEngine, NodeError, on_each
from launcher.host.planning import preflight
from launcher.host.planning.plan import LABEL_CLUSTER, ClusterPlan, GpuRequest, Node
from launcher.host.planning.preflight import Finding, NodeFacts, Severity
from launcher.host.planning.settings import LaunchSettings
from launcher.host.running.rootcause import LaunchError


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
    NICs, addresses and port, what every node's name resolves to there, the GPUs and the --mount folders. (What the
    checks find is not in the plan yet.)"""
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
        gpu_problem=node_gpu_problem(engine, settings.image, gpu_request) if gpu_request else None,
        missing_bind=engine.missing_bind(settings.image, binds) if binds else None,
    )


def node_gpu_problem(engine: NodeEngine, image: str, request: GpuRequest) -> str | None:
    """Why a node cannot give its workers the GPUs of `request`, held to the needs of the framework that its copy of
    the image holds (the image's label, app/gpu.py build_of); None if it can."""
    return engine.gpu_problem(image, request, build_of(engine.image_labels(image)))


def refuse_on(findings: list[Finding], say: Callable[[str], None]) -> None:
    """Says the notes and warnings; raises the first blocking finding as the launch's one root cause."""
    for finding in findings:
        if finding.severity in (Severity.NOTE, Severity.WARNING):
            say(finding.line())
    stop = preflight.blocking(findings)
    if stop:
        raise LaunchError(stop[0].line())


def check_nodes(
    settings: LaunchSettings, engines: list[NodeEngine], say: Callable[[str], None], dry_run: bool = False
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
    plan = ClusterPlan.of(settings)  # the launch's one plan: its cluster ID now, what the checks find below
    checked = on_each(
        list(zip(engines, facts, strict=True)),
        lambda engine_fact: host_facts(plan, *engine_fact) if engine_fact[1].image_id else engine_fact[1],
    )
    for fact in checked:
        if fact.image_id is None:
            say(f"{fact.node}: port, NIC and GPU checks run once the image is there")
        else:
            review(preflight.host_findings(settings, fact))
    review(preflight.naming_findings(settings, checked))
    plan = replace(plan, found=preflight.found_in(settings, checked))
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
    reference = settings.image_ref
    return f"pulls it from {reference.source}" if reference.pulled else None


def this_machine(image: str) -> tuple[NodeEngine, str | None]:
    """This machine's own engine (where --push-image copies from) and its ID of `image`, or one LaunchError."""
    try:
        engine = NodeDriver.local()
        return engine, engine.image_id(image)
    except NodeError as error:
        raise LaunchError(f"--push-image: {error}") from None


def push_from_this_machine(
    settings: LaunchSettings, targets: list[NodeEngine], say: Callable[[str], None]
) -> list[preflight.Finding]:
    """--push-image: the image copied from this machine's engine to `targets` (only the layers each lacks). What
    stops the copy before it starts (this machine lacks the image) comes back as findings, nothing copied then."""
    source, source_image = this_machine(settings.image)
    here = NodeFacts(source.node.name, source.node.engine_url, image_id=source_image)
    stop = preflight.push_source_findings(settings, here)
    if not stop:
        images.push_everywhere(source, targets, settings.image, say)
    return stop


def ensure_image_everywhere(
    settings: LaunchSettings, engines: list[NodeEngine], facts: list[NodeFacts], say: Callable[[str], None]
) -> list[NodeFacts]:
    """The same image on every node: pulled where IMAGE names a registry, copied from this machine's engine where
    --push-image asks for it. Returns the facts with each node's image ID as it is now."""
    image = settings.image
    missing = [engine for engine, fact in zip(engines, facts, strict=True) if fact.image_id is None]
    if missing and settings.push_image:
        refuse_on(push_from_this_machine(settings, missing, say), say)
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
