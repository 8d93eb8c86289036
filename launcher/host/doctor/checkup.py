"""`launcher doctor`: the checks a start makes (launcher.host.planning.preflight), on every node, printed in full
whatever they find, plus the clock skew and whether an address outside a node's subnet reaches Open MPI's ports there
(launcher.host.doctor.portcheck); with --links, every pair of nodes' link measured (launcher.host.doctor.link_probes)
and what it means for one allreduce (launcher.host.doctor.link_report).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import replace

from app.model_size import SIMPLENET_GRADIENT_MB, SIMPLENET_PARAMETERS
from launcher.core.nics import subnet_of
from launcher.core.protocol import LINK_SECONDS
from launcher.host.doctor import link_probes, link_report, portcheck
from launcher.host.engines.docker_driver import NodeDriver
from launcher.host.engines.node_engine import Connect, NodeEngine, NodeError, connecting_line
from launcher.host.planning import preflight
from launcher.host.planning.plan import ClusterPlan
from launcher.host.planning.preflight import HostView, NodeFacts
from launcher.host.planning.settings import LaunchSettings
from launcher.host.running.nodechecks import engine_facts, host_facts, image_coming, push_from_this_machine
from launcher.host.running.rootcause import LaunchError
from launcher.host.running.signals import stop_on_signals

Echo = Callable[[str], None]
READY = "all nodes ready"


def link_options_problem(
    links: bool, gradient_mb: float | None, link_seconds: float | None, compute_ms: float | None = None
) -> str | None:
    """Why the link test's options do not go together; None if they do."""
    given = [value for value in (gradient_mb, link_seconds, compute_ms) if value is not None]
    if given and not links:
        return "--gradient-mb, --compute-ms and --link-seconds are for the link test: add --links"
    if any(value <= 0 for value in given):
        return "--gradient-mb, --compute-ms and --link-seconds take a positive number"
    return None


def check(
    settings: LaunchSettings, echo: Echo, connect: Connect = NodeDriver.connect, say: Echo | None = None
) -> tuple[list[str], list[NodeEngine], dict[str, HostView]]:
    """Every node's findings, printed as they come; returns the problems (one line each), the engines reached and
    what each node looks like from a host-network container. With --push-image, the image is first copied from this
    machine's engine to the nodes that lack it (bring_image), so the checks that run in containers of the image
    (and the links) run on every node."""
    problems: list[str] = []
    engines: list[NodeEngine] = []
    views: dict[str, HostView] = {}
    unchecked = ClusterPlan.of(settings, cluster_id="-")
    facts_of: list[NodeFacts] = []

    def report(findings: list[preflight.Finding]) -> None:
        for finding in findings:
            echo(finding.doctor_line())
            if finding.severity in (preflight.Severity.BLOCKING, preflight.Severity.WARNING):
                problems.append(finding.line())

    for node in unchecked.nodes:
        echo(connecting_line(node))
        try:
            engine = connect(node)
        except NodeError as error:  # connect's only failure: the engine does not answer
            facts_of.append(NodeFacts(node.name, node.engine_url, unreachable=error.detail))
        else:
            engines.append(engine)
            facts_of.append(engine_facts(settings, engine))
    if settings.push_image:
        facts_of, brought = bring_image(settings, engines, facts_of, say or echo)
        report(brought)
    engine_of = {engine.node.name: engine for engine in engines}
    coming = image_coming(settings) if settings.push_image else None  # where the copy failed: said once, above
    for index, facts in enumerate(facts_of):
        reached = engine_of.get(facts.node)
        if reached is not None:
            if facts.image_id is not None:  # the host checks run in containers of the image
                facts = host_facts(unchecked, reached, facts)
            facts = replace(facts, clock_skew=reached.clock_skew_seconds())
            if facts.view is not None:
                views[facts.node] = facts.view
            facts_of[index] = facts
        report(preflight.check_node(settings, facts, coming))
    report(preflight.check_cluster(settings, facts_of) + preflight.naming_findings(settings, facts_of))
    return problems, engines, views


def check_ports(
    settings: LaunchSettings, engines: list[NodeEngine], views: dict[str, HostView], echo: Echo
) -> list[str]:
    """Each node's line on the ports a fixed-size job's Open MPI listens on (every address), reached or not from
    this machine where it is outside the node's subnet (portcheck); returns the problems (reached, port taken).
    Nodes whose checks did not run (engine or image missing) are left out: their lines above say why."""
    if settings.job.elastic:
        echo("all: mpi ports     ok an elastic job runs no Open MPI listener")
        return []
    problems = []
    subnet = subnet_of(settings.job.network_interface)
    node_ips = frozenset(
        str(ipaddress.ip_interface(address).ip)
        for view in views.values()
        for _, address in portcheck.real_addresses(view.addresses)
    )
    for engine in engines:
        view = views.get(engine.node.name)
        if view is None:
            continue
        verdict = portcheck.check_node(settings.image, engine, view.addresses, subnet, node_ips)
        severity = preflight.Severity.OK if verdict.said else preflight.Severity.NOTE
        finding = preflight.Finding(engine.node.name, "mpi ports", severity, verdict.what, verdict.fix)
        if not verdict.ok:
            finding = replace(finding, severity=preflight.Severity.WARNING)
            problems.append(finding.line())
        echo(finding.doctor_line())
    return problems


def bring_image(
    settings: LaunchSettings, engines: list[NodeEngine], facts: list[NodeFacts], say: Echo
) -> tuple[list[NodeFacts], list[preflight.Finding]]:
    """`doctor --push-image`: the image copied from this machine's engine to the nodes reached that lack it, as a
    start with --push-image copies it (only the layers they lack). Returns the facts with each node's image ID as it
    is now, and what stopped the copy (this machine without the image, a copy that failed) as findings."""
    lacking = {fact.node for fact in facts if fact.unreachable is None and fact.image_id is None}
    targets = [engine for engine in engines if engine.node.name in lacking]
    if not targets:
        return facts, []
    try:
        stop = push_from_this_machine(settings, targets, say)
        if stop:
            return facts, stop
    except (LaunchError, NodeError) as error:
        return facts, [preflight.Finding("all", "image", preflight.Severity.BLOCKING, f"the copy failed: {error}")]
    now = {engine.node.name: engine.image_id(settings.image) for engine in targets}
    return [replace(fact, image_id=now[fact.node]) if fact.node in now else fact for fact in facts], []


def measure_links(
    settings: LaunchSettings,
    engines: list[NodeEngine],
    views: dict[str, HostView],
    gradient_mb: float | None,
    seconds: float,
    echo: Echo,
    say: Echo,
    compute_ms: float | None = None,
) -> list[str]:
    """`doctor --links`: prints the matrix and the prediction; returns the problems (unreachable pairs)."""
    names = list(settings.nodes)
    if len(names) < 2:
        echo("links: one node, no link to measure")
        return []
    try:
        measured = link_probes.measure(settings, engines, views, seconds, say)
    except NodeError as error:
        return [str(error)]
    good = [result for result in measured if isinstance(result, link_report.Link)]
    failed = [result for result in measured if isinstance(result, link_report.Unreachable)]
    nic, port = settings.job.network_interface, settings.job.ssh_port
    over = f"over {nic}" if nic else "by node name (no NIC pinned)"
    echo(
        f"links: host-network containers, {over}, TCP port {port}, {seconds:g} s each way; from the row's node to "
        "the column's"
    )
    if good:
        for line in link_report.format_matrix(names, good):
            echo(f"  {line}")
    for failure in failed:
        echo(f"links: FAIL {link_report.unreachable_line(failure)}")
    if failed:
        return [link_report.unreachable_line(failure) for failure in failed]
    what = "--gradient-mb" if gradient_mb else f"the bundled trainer's SimpleNet, {SIMPLENET_PARAMETERS} floats"
    ranks = ClusterPlan.of(settings, cluster_id="-").total_ranks
    prediction = link_report.predict(good, gradient_mb or SIMPLENET_GRADIENT_MB, ranks)
    for line in link_report.prediction_lines(prediction, what):
        echo(f"links: {line}")
    echo(f"links: advice: {advise(settings, engines, prediction, gradient_mb, compute_ms, say)}")
    return []


def advise(
    settings: LaunchSettings,
    engines: list[NodeEngine],
    prediction: link_report.Prediction,
    gradient_mb: float | None,
    compute_ms: float | None,
    say: Echo,
) -> str:
    """The advice line (link_report.advice): the compute per step given (--compute-ms) or, for the bundled trainer,
    measured once on rank 0's node; a gradient of the user's own needs its compute given."""
    if compute_ms is not None:
        return link_report.advice(prediction.ring_s, compute_ms / 1e3, "--compute-ms")
    if gradient_mb is not None:
        return "pass --compute-ms (your model's compute per step, e.g. one rank alone) to hold the exchange against it"
    rank0 = next((engine for engine in engines if engine.node.name == settings.nodes[0]), None)
    if rank0 is None:
        return f"the compute per step was not measured ({settings.nodes[0]} not reached); pass --compute-ms"
    say(f"links: the bundled trainer's compute per step, alone, on {rank0.node.name}")
    measured = link_probes.measure_compute(settings, rank0)
    if isinstance(measured, str):
        return f"the compute per step was not measured on {rank0.node.name} ({measured}); pass --compute-ms"
    return link_report.advice(prediction.ring_s, measured, f"the bundled trainer's, measured on {rank0.node.name}")


def examine(
    settings: LaunchSettings,
    echo: Echo,
    say: Echo,
    *,
    with_links: bool = False,
    gradient_mb: float | None = None,
    link_seconds: float | None = None,
    compute_ms: float | None = None,
) -> list[str]:
    """`launcher doctor`, start to end: every node's findings printed (check), each node's Open MPI ports (check_ports),
    then, with links asked for and no
    problem so far, the links measured between host-network containers (measure_links; a signal meanwhile raises
    Signalled, once linkcheck has removed its containers; with --push-image, a signal during the copy too, as in a
    start); returns the problems, one line each."""
    if settings.push_image:
        stop_on_signals()
    problems, engines, views = check(settings, echo, say=say)
    stop_on_signals()  # the port probe's container is removed before a signal ends doctor
    port_problems = check_ports(settings, engines, views, echo)
    if with_links and problems:
        echo("links: not measured: fix the problems above first")
    elif with_links:
        stop_on_signals()
        seconds = link_seconds or LINK_SECONDS
        problems = measure_links(settings, engines, views, gradient_mb, seconds, echo, say, compute_ms=compute_ms)
    return problems + port_problems


def verdict(problems: list[str]) -> tuple[str, int]:
    """Doctor's last line and exit status: every node ready (0), or how many problems and which (1)."""
    if problems:
        return f"{len(problems)} problem(s): {'; '.join(problems)}", 1
    return READY, 0
