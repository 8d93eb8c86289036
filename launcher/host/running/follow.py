"""An attached job, followed from this machine once its agent has started: the agent's log streamed from rank 0's
container until the job ends (follow_job: the job's output, or only --ranks', and the agent's own lines apart), and,
for an elastic job, its other workers watched while it runs (WorkerWatch: one that stops is named; with
--restart-workers its node's engine starts it again, launcher/host/planning/plan.py's WorkerContainer.restarts).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from typing import IO

from launcher.core.jobend import JobEnd, parse_job_end
from launcher.core.protocol import AGENT, AGENT_PREFIX, JOB_STATUS
from launcher.host.engines.docker_driver import NodeDriver
from launcher.host.engines.node_engine import Connect, Container, NodeEngine, NodeError
from launcher.host.planning.plan import ClusterPlan
from launcher.host.running import ranklogs

FOLLOW_ATTEMPTS = 5
"""How often the launcher re-attaches to a running job whose log stream broke (an engine connection dropped)."""


def follow_job(
    engine: NodeEngine,
    container: Container,
    out: IO[str],
    relay: Callable[[str], None],
    ranks: Collection[int] | None = None,
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
    """An attached elastic job's eye on the workers other than rank 0's: says why one stopped (killed, out of
    memory, removed: what the engines see and the agent cannot), and keeps the nodes lost now for the root cause. It
    opens its own engine connections; the main thread's stream the job's output."""

    def __init__(
        self,
        plan: ClusterPlan,
        containers: list[Container],
        say: Callable[[str], None],
        connect: Connect = NodeDriver.connect,
    ) -> None:
        super().__init__(name="worker-watch", daemon=True)
        self.plan, self.say, self.connect = plan, say, connect
        self.container_ids = {node.name: c.id for node, c in zip(plan.nodes[1:], containers[1:], strict=True)}
        self.lost: dict[str, str] = {}
        """Nodes whose worker is down right now, and why."""
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

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=10)
