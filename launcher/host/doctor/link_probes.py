"""`launcher doctor --links`, its Docker side: for each pair of nodes, one at a time (so no two transfers share a link
or this machine's CPU), a short-lived host-network container of the image on the later node serves
launcher/agent/linkprobe.py and one on the earlier node probes it, over the addresses the job would use
(launcher/host/doctor/link_report.py job_address; with no NIC pinned, the node's name, as the hostfile has it). Every
container is removed when its pair is done and, whatever stops the run (an error, Ctrl-C, SIGTERM), before this returns;
if this process dies outright, each still ends by itself (the probe's bounds and timeouts), and carries the stack's
cluster label, so `launcher stop` removes it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from launcher.core.protocol import LINK_PROBE, STEP_TIME_PROBE
from launcher.host.doctor.link_report import Link, Unreachable, job_address, last_json, pairs, read_probe
from launcher.host.engines.node_engine import NodeEngine
from launcher.host.planning.plan import LABEL_CLUSTER, LABEL_NODE, LABEL_ROLE
from launcher.host.planning.preflight import HostView
from launcher.host.planning.settings import LaunchSettings

SERVER_START_S = 60.0
"""How long a server container may take to start listening (an engine over ssh, a loaded node)."""
ACCEPT_S = 30.0
CONNECT_S = 5.0
STEP_TIME_S = 300.0
"""How long the compute measure may take (torch's import on a loaded node is most of it)."""


def measure(
    settings: LaunchSettings,
    engines: list[NodeEngine],
    views: dict[str, HostView],
    seconds: float,
    say: Callable[[str], None],
) -> list[Link | Unreachable]:
    """Every pair's link both ways, in node order; the containers are gone when it returns or raises."""
    by_name = {engine.node.name: engine for engine in engines}
    cluster = f"links-{secrets.token_hex(4)}"
    nic, port = settings.job.network_interface, settings.job.ssh_port

    def run(engine: NodeEngine, role: str, argv: list[str]) -> str:
        return engine.start_probe(
            settings.image,
            [*LINK_PROBE, *argv],
            name=f"horovod-stack-{cluster}-{engine.node.name}-{role}",
            labels={LABEL_CLUSTER: cluster, LABEL_ROLE: f"links-{role}", LABEL_NODE: engine.node.name},
        )

    results: list[Link | Unreachable] = []
    try:
        for source, target in pairs(list(settings.nodes)):
            address = job_address(views[target].addresses, nic)
            own = job_address(views[source].addresses, nic)
            say(f"links: {source} <-> {target} ({address or target}:{port}, {seconds:g} s each way)")
            bounds = ["--port", str(port), "--seconds", str(seconds)]
            serve_argv = ["serve", "--bind", address or "0.0.0.0", "--timeout", str(ACCEPT_S), *bounds]
            server = run(by_name[target], "server", serve_argv)
            listening = by_name[target].wait_for_output(server, '"listening"', SERVER_START_S)
            if listening is None or '"listening"' not in listening:
                why = (listening or "").strip().splitlines()[-1:] or [f"not listening after {SERVER_START_S:g} s"]
                results.append(Unreachable(source, target, address or target, port, f"its server: {why[0][:200]}"))
            else:
                probe_argv = ["probe", "--target", address or target, "--timeout", str(CONNECT_S), *bounds]
                probe = run(by_name[source], "probe", [*probe_argv, *(["--source", own] if own else [])])
                output = by_name[source].finish(probe, timeout=4 * seconds + ACCEPT_S + 30)
                results.append(read_probe(source, target, address or target, port, output))
            for name in (target, source):
                by_name[name].remove_cluster(cluster)
    finally:  # by label: also a container whose start an interruption cut short, before its handle came back
        for engine in engines:
            engine.remove_cluster(cluster)
    return results


def measure_compute(settings: LaunchSettings, engine: NodeEngine) -> float | str:
    """The bundled trainer's compute per step on `engine`'s node (app/step_time.py, in a short-lived container of the
    image, removed before this returns), in seconds; or, where it could not be measured, why."""
    cluster = f"links-{secrets.token_hex(4)}"
    try:
        container = engine.start_probe(
            settings.image,
            list(STEP_TIME_PROBE),
            name=f"horovod-stack-{cluster}-{engine.node.name}-compute",
            labels={LABEL_CLUSTER: cluster, LABEL_ROLE: "links-compute", LABEL_NODE: engine.node.name},
        )
        output = engine.finish(container, timeout=STEP_TIME_S)
    finally:
        engine.remove_cluster(cluster)
    step = last_json(output).get("step_s")
    if isinstance(step, (int, float)) and step > 0:
        return float(step)
    return (output.strip().splitlines() or ["no output"])[-1][:200]
