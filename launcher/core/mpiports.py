"""The TCP ports a fixed-size job's Open MPI listens on, on every node: one documented range (OPEN_MPI_PORTS), the
mpirun arguments that pin its listeners into it (port_selection), the ranks a node can hold with it (ranks_problem)
and what `launcher doctor` says of a node's range as seen from outside the node's subnet (port_verdict). Pure:
launcher/host/doctor/portcheck.py does the probing.

Open MPI 4.1 binds these listeners to every address of the node, IPv4 and IPv6, whatever btl_tcp_if_include and
oob_tcp_if_include say (they choose what is advertised and used, not what is bound; it has no setting for the bound
address), so a firewall is the only way to keep them from strangers, and a firewall needs exact ports. Measured in
the image (Open MPI 4.1.4): the rank's IPv6 listener is dual-stack, so an IPv6 range that overlaps the IPv4 one
finds no free port at all; oob_tcp_dynamic_ipv4_ports makes mpirun hold every port of its list at once, so the
daemons take one static port per family instead.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass


@dataclass(frozen=True)
class PortRange:
    """TCP ports first to last, both included."""

    first: int
    last: int

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.first <= port <= self.last

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


OPEN_MPI_PORTS = PortRange(12350, 12605)
"""Every TCP port a fixed-size job's Open MPI listens on, on each node: mpirun's (rank 0's node) or orted's (the
others) out-of-band channel on the first two (IPv4, IPv6), then each rank's TCP transport, IPv4 ports then IPv6.
Past the workers' sshd port (12345 by default). Besides it, mpirun holds one port on 127.0.0.1 (its PMIx server)."""
DAEMON_PORTS = 2
"""mpirun's or orted's out-of-band listeners: one static port per family (an IPv4 one, then an IPv6 one)."""
RANKS_PER_NODE_MAX = (OPEN_MPI_PORTS.size - DAEMON_PORTS) // 2
"""Ranks a node can hold with the range: each takes one IPv4 port and one IPv6 port."""


def ranks_problem(ranks: int, ports: PortRange = OPEN_MPI_PORTS) -> str | None:
    """Why a node cannot run `ranks` ranks of a fixed-size job (each needs a port of each family in `ports`: past
    that, a rank's MPI_Init fails with "no port available in the range"); None if it can."""
    most = (ports.size - DAEMON_PORTS) // 2
    if ranks <= most:
        return None
    return f"{ranks} ranks there, and Open MPI's ports ({ports}) hold {most} a node; run at most {most} (--slots)"


def daemon_port(ports: PortRange = OPEN_MPI_PORTS) -> int:
    """The IPv4 port mpirun or orted listens on (every node's one): the one doctor's probe holds."""
    return ports.first


def port_selection(ports: PortRange = OPEN_MPI_PORTS) -> list[str]:
    """mpirun's arguments that keep every listener of a fixed-size job in `ports`: the daemons on static ports, the
    ranks' transport from disjoint IPv4 and IPv6 ranges (mpirun hands the settings to every orted and rank)."""
    per_family = (ports.size - DAEMON_PORTS) // 2
    ipv4_first = ports.first + DAEMON_PORTS
    ipv6_first = ipv4_first + per_family
    settings = {
        "oob_tcp_static_ipv4_ports": ports.first,
        "oob_tcp_static_ipv6_ports": ports.first + 1,
        "btl_tcp_port_min_v4": ipv4_first,
        "btl_tcp_port_range_v4": per_family,
        "btl_tcp_port_min_v6": ipv6_first,
        "btl_tcp_port_range_v6": per_family,
    }
    return [word for name, value in settings.items() for word in ("--mca", name, str(value))]


def firewall_line(nic: str, subnet: str, ports: PortRange = OPEN_MPI_PORTS) -> str:
    """The iptables rule that keeps everything outside `subnet` off the range on `nic`."""
    return f"iptables -A INPUT -i {nic} -p tcp --dport {ports.first}:{ports.last} ! -s {subnet} -j DROP"


@dataclass(frozen=True)
class AddressProbe:
    """One address of a node, seen from this machine: a connect to the daemon port from `source` (this machine's
    address towards it), made only where `source` is outside the cluster's subnet and no node's."""

    nic: str
    address: str
    """IPv4 address/prefix, as the node holds it."""
    source: str | None
    """This machine's address towards it; None where no route leads there."""
    reached: bool | None = None
    """Whether the connect got through; None where it was not tried (this machine inside the subnet, or no route)."""
    cluster_subnet: str | None = None
    """The job's subnet (--network-interface) where the address is in it; else the NIC's own prefix is the subnet."""
    from_node: bool = False
    """Whether `source` is an address of one of the cluster's nodes (a node is no stranger, whatever the prefixes)."""

    @property
    def subnet(self) -> str:
        return self.cluster_subnet or str(ipaddress.ip_interface(self.address).network)

    @property
    def ip(self) -> str:
        return str(ipaddress.ip_interface(self.address).ip)

    @property
    def outside(self) -> bool:
        """Whether this machine's source address is a stranger's: outside the subnet, and no node's."""
        if self.source is None or self.from_node:
            return False
        return ipaddress.ip_address(self.source) not in ipaddress.ip_network(self.subnet)


@dataclass(frozen=True)
class PortVerdict:
    """What doctor says of one node's range: `ok` or a warning (`fix` then holds the firewall rules)."""

    ok: bool
    what: str
    fix: str = ""
    said: bool = True
    """False where nothing could be told from here (a note, not a pass)."""


def port_verdict(probes: list[AddressProbe], busy: str | None = None, ports: PortRange = OPEN_MPI_PORTS) -> PortVerdict:
    """One node's verdict from its probes: reached from outside its subnet (a warning, with the rule per NIC),
    firewalled, or not told from here (this machine inside every subnet, or no route). `busy`: why the probe could
    not hold the daemon port (something else listens there: the job could not start on that node)."""
    listens = f"a fixed-size job's Open MPI listens on TCP {ports} on every address"
    if busy is not None:
        return PortVerdict(False, f"{listens}; port {daemon_port(ports)} is taken ({busy})", "free it on that node")
    reached = [probe for probe in probes if probe.reached]
    if reached:
        where = ", ".join(f"{probe.ip} ({probe.nic})" for probe in reached)
        outside = ", ".join(sorted({f"{probe.source} (outside {probe.subnet})" for probe in reached}))
        rules = "; ".join(dict.fromkeys(firewall_line(probe.nic, probe.subnet, ports) for probe in reached))
        return PortVerdict(False, f"{listens}; {where} reached from {outside}", f"firewall it on that node: {rules}")
    tried = [probe for probe in probes if probe.reached is False]
    if tried:
        where = ", ".join(f"{probe.ip} ({probe.nic})" for probe in tried)
        sources = ", ".join(sorted({str(probe.source) for probe in tried}))
        return PortVerdict(True, f"{listens}; {where} not reached from {sources}, outside its subnet")
    nodes = sorted({str(probe.source) for probe in probes if probe.from_node})
    inside = sorted({f"{probe.source} in {probe.subnet}" for probe in probes if probe.source and not probe.from_node})
    why = "no route from this machine"
    if nodes:
        why = f"this machine is one of the nodes ({', '.join(nodes)})"
    elif inside:
        why = f"this machine is inside its subnets ({', '.join(inside)})"
    return PortVerdict(
        True, f"{listens}; cannot tell from here whether an address outside its subnet reaches them: {why}", said=False
    )
