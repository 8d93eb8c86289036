"""`launcher doctor`: the checks a start makes (launcher.preflight), on every node, printed in full whatever they
find, plus the clock skew; with --links, every pair of nodes' link measured (launcher.linkcheck) and what it means
for one allreduce (launcher.links).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from app.model_size import SIMPLENET_GRADIENT_MB, SIMPLENET_PARAMETERS
from launcher import linkcheck, links, preflight
from launcher.engine import Connect, NodeDriver, NodeEngine, NodeError, connecting_line
from launcher.plan import ClusterPlan
from launcher.preflight import HostView, NodeFacts
from launcher.session import engine_facts, host_facts
from launcher.settings import LaunchSettings

Echo = Callable[[str], None]


def link_options_problem(links: bool, gradient_mb: float | None, link_seconds: float | None) -> str | None:
    """Why the link test's options do not go together; None if they do."""
    if (gradient_mb is not None or link_seconds is not None) and not links:
        return "--gradient-mb and --link-seconds are for the link test: add --links"
    if (gradient_mb is not None and gradient_mb <= 0) or (link_seconds is not None and link_seconds <= 0):
        return "--gradient-mb and --link-seconds take a positive number"
    return None


def check(
    settings: LaunchSettings, echo: Echo, connect: Connect = NodeDriver.connect
) -> tuple[list[str], list[NodeEngine], dict[str, HostView]]:
    """Every node's findings, printed as they come; returns the problems (one line each), the engines reached and
    what each node looks like from a host-network container."""
    problems: list[str] = []
    engines: list[NodeEngine] = []
    views: dict[str, HostView] = {}
    facts_of: list[NodeFacts] = []
    unchecked = ClusterPlan.of(settings, cluster_id="-")
    for node in unchecked.nodes:
        echo(connecting_line(node))
        try:
            engine = connect(node)
        except NodeError as error:  # connect's only failure: the engine does not answer
            facts = NodeFacts(node.name, node.engine_url, unreachable=error.detail)
        else:
            engines.append(engine)
            facts = engine_facts(settings, engine)
            if facts.image_id is not None:  # the host checks run in containers of the image
                facts = host_facts(unchecked, engine, facts)
            facts = replace(facts, clock_skew=engine.clock_skew_seconds())
            if facts.view is not None:
                views[node.name] = facts.view
        facts_of.append(facts)
        for finding in preflight.check_node(settings, facts):
            echo(finding.doctor_line())
            if finding.severity in (preflight.Severity.BLOCKING, preflight.Severity.WARNING):
                problems.append(finding.line())
    for finding in preflight.check_cluster(settings, facts_of) + preflight.naming_findings(settings, facts_of):
        echo(finding.doctor_line())
        if finding.severity in (preflight.Severity.BLOCKING, preflight.Severity.WARNING):
            problems.append(finding.line())
    return problems, engines, views


def measure_links(
    settings: LaunchSettings,
    engines: list[NodeEngine],
    views: dict[str, HostView],
    gradient_mb: float | None,
    seconds: float,
    echo: Echo,
    say: Echo,
) -> list[str]:
    """`doctor --links`: prints the matrix and the prediction; returns the problems (unreachable pairs)."""
    names = list(settings.nodes)
    if len(names) < 2:
        echo("links: one node, no link to measure")
        return []
    try:
        measured = linkcheck.measure(settings, engines, views, seconds, say)
    except NodeError as error:
        return [str(error)]
    good = [result for result in measured if isinstance(result, links.Link)]
    failed = [result for result in measured if isinstance(result, links.Unreachable)]
    nic, port = settings.job.network_interface, settings.job.ssh_port
    over = f"over {nic}" if nic else "by node name (no NIC pinned)"
    echo(
        f"links: host-network containers, {over}, TCP port {port}, {seconds:g} s each way; from the row's node to "
        "the column's"
    )
    if good:
        for line in links.format_matrix(names, good):
            echo(f"  {line}")
    for failure in failed:
        echo(f"links: FAIL {links.unreachable_line(failure)}")
    if failed:
        return [links.unreachable_line(failure) for failure in failed]
    what = "--gradient-mb" if gradient_mb else f"the bundled trainer's SimpleNet, {SIMPLENET_PARAMETERS} floats"
    ranks = ClusterPlan.of(settings, cluster_id="-").total_ranks
    prediction = links.predict(good, gradient_mb or SIMPLENET_GRADIENT_MB, ranks)
    for line in links.prediction_lines(prediction, what):
        echo(f"links: {line}")
    return []
