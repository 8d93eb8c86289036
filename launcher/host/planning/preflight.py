"""The checks before any worker starts, one set for `start`, `start --dry-run` and `doctor`: pure functions from
what each node's engine reported (NodeFacts) to typed Findings, and from the facts to what the plan needs (Found).

`start` refuses on the first blocking finding (a warning it only says), `doctor` prints every finding and fails on
any blocking one or warning (so a cluster still running there fails it too), `--dry-run` prints them all with the
plan and refuses as a start would. Gathering the facts (the engine's side effects) is nodechecks.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from launcher.core.mpiports import ranks_problem
from launcher.core.nics import (
    listen_addresses,
    nic_problem,
    own_nic,
    subnet_of,
    subnet_problem,
    virtual_subnets,
)
from launcher.host.planning.plan import Found, GpuRequest, worker_host_names
from launcher.host.planning.settings import LaunchSettings


@dataclass(frozen=True)
class HostView:
    """The node as its host-network workers will see it."""

    port_taken: bool
    nics: tuple[str, ...]
    addresses: tuple[tuple[str, str], ...] = ()
    """(NIC, IPv4 address/prefix) for each address the node has."""
    resolved: tuple[tuple[str, str], ...] = ()
    """(name, IPv4 address) for each name asked about that resolves there."""


CLOCK_SKEW_LIMIT_SECONDS = 5.0
"""More than this between a node's clock and this machine's makes logs and metrics hard to line up."""


FIXES = {
    "cluster running": "stop it first with `launcher stop --nodes {nodes} --cluster {cluster}`",
    "cluster finished": "`launcher stop --nodes {nodes} --cluster {cluster}` removes it",
    "image missing": "pass --push-image to copy it from this machine's engine, load it on that node, or name it in a "
    "registry (IMAGE=USER/NAME:TAG on Docker Hub, or REGISTRY/NAME:TAG)",
    "clock skew": "sync the node's clock (NTP)",
    "ssh port": "free it or pass --ssh-port with a free port",
    "mounts": "make it, or mount the same share at that path on every node",
    "names": "add to DNS or to /etc/hosts on {node} (the workers read the host's): {example}",
    "image differs": "mismatched Horovod/MPI builds hang, so load one image on every node (docker save | docker load)",
    "push source": "build it with scripts/build-images.sh",
}
"""The fix each check's finding names, one line each (str.format fields filled in by the check). `start`, its
--dry-run and `doctor` print them alike, so every launcher command or --flag they name must be both commands'
(tests/test_session_checks.py runs each through the CLI's parser)."""


class Severity(Enum):
    OK = "ok"
    NOTE = "note"
    """Worth saying; changes nothing (a finished cluster kept, an image a start will copy)."""
    WARNING = "warning"
    """A start goes on; doctor fails on it."""
    BLOCKING = "blocking"
    """A start would fail, so it does not begin."""


@dataclass(frozen=True)
class Finding:
    node: str
    check: str
    """What was checked, as doctor's column names it: engine, image, ssh port, network iface, GPUs, ..."""
    severity: Severity
    what: str
    """What was found: a problem, or (when ok) the detail doctor prints."""
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.severity is Severity.OK

    def line(self) -> str:
        """One line naming the node, the problem and the fix."""
        return f"{self.node}: {self.what}" + (f"; {self.fix}" if self.fix else "")

    def doctor_line(self) -> str:
        mark = {Severity.OK: "ok", Severity.NOTE: "note"}.get(self.severity, "FAIL")
        return f"{self.node}: {self.check:<13} {mark} {self.what}" + (f"; {self.fix}" if self.fix else "")


@dataclass(frozen=True)
class NodeFacts:
    """What one node's engine reported; None where it was not asked (the engine unreachable, the image missing)."""

    node: str
    engine_url: str
    rank0: bool = False
    version: str | None = None
    unreachable: str | None = None
    """The engine's connection error, when it does not answer."""
    running_clusters: tuple[str, ...] = ()
    finished_clusters: tuple[str, ...] = ()
    image_id: str | None = None
    view: HostView | None = None
    """The node as its host-network workers will see it (a container of the image)."""
    resolve: tuple[str, ...] = ()
    """The names the view was asked to resolve (every node's)."""
    host_name: str | None = None
    """The node's own host name, as its engine reports it."""
    gpu_request: GpuRequest | None = None
    gpu_problem: str | None = None
    missing_bind: str | None = None
    clock_skew: float | None = None


def check_node(settings: LaunchSettings, facts: NodeFacts, image_coming: str | None = None) -> list[Finding]:
    """Every finding about one node, in the order a start needs them. `image_coming` says how a missing image will
    get there ("copies it there from this machine", "pulls it from REGISTRY"); None: it will not, so it blocks."""
    node = facts.node
    nodes = ",".join(settings.nodes)

    def found(check: str, severity: Severity, what: str, fix: str = "") -> Finding:
        return Finding(node, check, severity, what, fix)

    if facts.unreachable is not None:
        return [found("engine", Severity.BLOCKING, facts.unreachable)]
    findings = [found("engine", Severity.OK, f"({facts.version} at {facts.engine_url})")]
    for cluster in facts.running_clusters:
        findings.append(
            found(
                "cluster",
                Severity.BLOCKING,
                f"cluster {cluster} is still running",
                FIXES["cluster running"].format(nodes=nodes, cluster=cluster),
            )
        )
    for cluster in facts.finished_clusters:
        findings.append(
            found(
                "cluster",
                Severity.NOTE,
                f"finished cluster {cluster} is kept for `launcher status` and `launcher logs`",
                FIXES["cluster finished"].format(nodes=nodes, cluster=cluster),
            )
        )
    if facts.image_id is None:
        if image_coming:
            findings.append(found("image", Severity.NOTE, f"lacks {settings.image}; a start {image_coming}"))
        else:
            findings.append(
                found(
                    "image",
                    Severity.BLOCKING,
                    f"image {settings.image} is not there",
                    FIXES["image missing"],
                )
            )
    else:
        findings.append(found("image", Severity.OK, f"({facts.image_id[7:19]})"))
    findings += host_findings(settings, facts)
    if facts.clock_skew is not None:  # doctor's only: a start goes on regardless
        skew = facts.clock_skew
        if abs(skew) > CLOCK_SKEW_LIMIT_SECONDS:
            findings.append(found("clock skew", Severity.WARNING, f"clock skew {skew:+.1f} s", FIXES["clock skew"]))
        else:
            findings.append(found("clock skew", Severity.OK, f"({skew:+.1f} s)"))
    return findings


def host_findings(settings: LaunchSettings, facts: NodeFacts) -> list[Finding]:
    """The NIC or subnet, the SSH port, the ranks Open MPI's ports hold, the GPUs, the --mount folders and (on rank
    0's node) the names Open MPI needs addresses for: each a worker or mpirun would otherwise fail on after other
    workers started, in Docker's or Open MPI's words that never name the fix. None before the node's view is known
    (the image missing)."""
    view = facts.view
    if view is None:
        return []
    node, job = facts.node, settings.job
    nic, port = job.network_interface, job.ssh_port
    findings = []
    subnet = subnet_of(nic)
    problem = subnet_problem(subnet, view.addresses) if subnet else nic_problem(nic, view.nics)
    if problem:
        findings.append(Finding(node, "network iface", Severity.BLOCKING, problem))
    elif subnet:
        own = own_nic(subnet, view.addresses)
        listed = ", ".join(f"{name} {address}" for name, address in view.addresses if name == own)
        findings.append(Finding(node, "network iface", Severity.OK, f"({listed or subnet})"))
    elif nic:
        findings.append(Finding(node, "network iface", Severity.OK, f"({nic})"))
    else:
        left_out = ", ".join(virtual_subnets(view.addresses)) or "none here"
        findings.append(
            Finding(node, "network iface", Severity.OK, f"(none pinned; virtual NICs left out: {left_out})")
        )
    if view.port_taken:
        findings.append(
            Finding(
                node,
                "ssh port",
                Severity.BLOCKING,
                f"port {port} is already in use there",
                FIXES["ssh port"],
            )
        )
    else:
        findings.append(Finding(node, "ssh port", Severity.OK, f"free ({port})"))
    too_many = None if job.elastic else ranks_problem(settings.ranks_on(node))
    if too_many:
        findings.append(Finding(node, "mpi ports", Severity.BLOCKING, too_many))
    if facts.gpu_request is not None:
        if facts.gpu_problem:
            findings.append(Finding(node, "GPUs", Severity.BLOCKING, facts.gpu_problem))
        else:
            findings.append(Finding(node, "GPUs", Severity.OK, f"({facts.gpu_request} asked for)"))
    if facts.missing_bind:
        findings.append(
            Finding(
                node,
                "mounts",
                Severity.BLOCKING,
                f"a --mount folder is not there ({facts.missing_bind})",
                FIXES["mounts"],
            )
        )
    return findings


def naming_findings(settings: LaunchSettings, facts: list[NodeFacts]) -> list[Finding]:
    """What the nodes' views say together. Every node's name must resolve on rank 0's node, where mpirun reaches
    each by it (blocking), and should on every other (the ranks there may look a peer up: a warning); nodes that
    share one host name (servers cloned from one image) are told apart by their workers' own (a note)."""
    findings = []
    known = {name: address for fact in facts if fact.view for name, address in fact.view.resolved}
    for fact in facts:
        if fact.view is None:
            continue
        missing = sorted(set(fact.resolve) - {name for name, _ in fact.view.resolved})
        if missing:
            example = ", ".join(f"`{known.get(name, 'ADDRESS')} {name}`" for name in missing)
            why = "mpirun there reaches every node by its name" if fact.rank0 else "ranks there may look a peer up"
            findings.append(
                Finding(
                    fact.node,
                    "names",
                    Severity.BLOCKING if fact.rank0 else Severity.WARNING,
                    f"{', '.join(missing)} {'does' if len(missing) == 1 else 'do'} not resolve there ({why})",
                    FIXES["names"].format(node=fact.node, example=example),
                )
            )
        elif fact.resolve:
            findings.append(Finding(fact.node, "names", Severity.OK, f"(all {len(fact.resolve)} node names resolve)"))
    by_host_name: dict[str, list[str]] = {}
    for fact in facts:
        if fact.host_name:
            by_host_name.setdefault(fact.host_name, []).append(fact.node)
    own = worker_host_names(settings.all_nodes)
    for host_name, nodes in by_host_name.items():
        if len(nodes) > 1:
            findings.append(
                Finding(
                    ", ".join(nodes),
                    "host names",
                    Severity.NOTE,
                    f"share the host name {host_name}: each worker gets its own "
                    f"({', '.join(own[node] for node in nodes)}), so Open MPI tells the nodes apart",
                )
            )
    return findings


def check_cluster(settings: LaunchSettings, facts: list[NodeFacts]) -> list[Finding]:
    """What no single node shows: the image must be the very same build everywhere."""
    ids = {fact.node: fact.image_id for fact in facts if fact.image_id}
    if len(set(ids.values())) <= 1:
        return []
    listing = ", ".join(f"{name} {image_id[7:19]}" for name, image_id in ids.items())
    return [
        Finding(
            "all",
            "image",
            Severity.BLOCKING,
            f"image {settings.image} differs between nodes ({listing})",
            FIXES["image differs"],
        )
    ]


def push_source_findings(settings: LaunchSettings, source: NodeFacts) -> list[Finding]:
    """--push-image copies the image from this machine's engine (`source`), which must have it."""
    if source.image_id:
        return []
    return [
        Finding(
            source.node,
            "image",
            Severity.BLOCKING,
            f"no image {settings.image} either, and --push-image copies it from here",
            FIXES["push source"],
        )
    ]


def blocking(findings: list[Finding]) -> list[Finding]:
    return [finding for finding in findings if finding.severity is Severity.BLOCKING]


def found_in(settings: LaunchSettings, facts: list[NodeFacts]) -> Found:
    """What the plan takes from the facts: each node's NIC in the subnet, the node addresses rank 0 resolved, and, with
    no NIC pinned across nodes, the virtual NICs' subnets the job leaves out."""
    nic = settings.job.network_interface
    subnet = subnet_of(nic)
    views = [(fact, fact.view) for fact in facts if fact.view is not None]
    node_nics = tuple((fact.node, own) for fact, view in views if subnet and (own := own_nic(subnet, view.addresses)))
    addresses = next((view.resolved for fact, view in views if fact.rank0), ())
    excluded: tuple[str, ...] = ()
    if not nic and len(settings.nodes) > 1:
        excluded = tuple(virtual_subnets([pair for _, view in views for pair in view.addresses]))
    reached_at = dict(addresses)
    listen = tuple(
        (fact.node, found)
        for fact, view in views
        if nic and (found := listen_addresses(view.addresses, nic, reached_at.get(fact.node)))
    )
    return Found(node_nics=node_nics, addresses=addresses, excluded_subnets=excluded, listen_addresses=listen)
