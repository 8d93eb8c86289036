"""`launcher doctor`'s Open MPI port check, its network side: for each node, this machine's source address towards
each of the node's real IPv4 addresses (the route's, by a UDP connect that sends nothing); where that is outside the
address's subnet, a short-lived host-network container of the image holds Open MPI's daemon port on every address
(linkprobe hold, as mpirun and orted would) and this machine tries a TCP connect to it. The container is removed
before this returns, whatever happens, and ends by itself (its --seconds) if this process dies first. The verdict
is launcher/core/mpiports.py's (pure).
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
from dataclasses import replace

from launcher.core.mpiports import OPEN_MPI_PORTS, AddressProbe, PortVerdict, daemon_port, port_verdict
from launcher.core.nics import VIRTUAL_NIC_PREFIXES, Addresses
from launcher.core.protocol import LINK_PROBE
from launcher.host.doctor.link_report import last_json
from launcher.host.engines.node_engine import NodeEngine, NodeError
from launcher.host.planning.plan import LABEL_CLUSTER, LABEL_NODE, LABEL_ROLE

ADDRESS_IN_USE = "Address already in use"
"""The end of the probe's error where something else holds the port (Python's words for EADDRINUSE)."""
PROBE_FIX = "use an image built from the same checkout as this launcher (scripts/build-images.sh)"
"""An image older than the launcher lacks the probe's `hold`: the usual reason it does not listen."""
CONNECT_S = 3.0
"""A firewall that drops is told by the connect's timeout: long enough for a slow link, short for a doctor run."""
HOLD_S = 120.0
"""How long the probe container listens at most (it is removed as soon as the connects are done)."""
LISTEN_S = 60.0
"""How long the container may take to start listening (an engine over ssh, a loaded node)."""


def real_addresses(addresses: Addresses) -> list[tuple[str, str]]:
    """The (NIC, address/prefix) pairs a stranger could reach: neither loopback nor a virtual NIC's."""
    return [
        (nic, address)
        for nic, address in addresses
        if not nic.startswith(VIRTUAL_NIC_PREFIXES) and not ipaddress.ip_interface(address).is_loopback
    ]


def source_towards(address: str, port: int) -> str | None:
    """This machine's address that a packet to `address` leaves from (the route's choice); None without a route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        try:
            udp.connect((address, port))  # a UDP connect picks the route and sends nothing
        except OSError:
            return None
        return str(udp.getsockname()[0])


def connects(address: str, port: int) -> bool:
    """Whether a TCP connect from this machine to address:port is answered within CONNECT_S."""
    try:
        with socket.create_connection((address, port), timeout=CONNECT_S):
            return True
    except OSError:
        return False


def probes_of(addresses: Addresses, subnet: str | None, node_ips: frozenset[str], port: int) -> list[AddressProbe]:
    """The node's real addresses, each with this machine's source towards it and the subnet it is held to: the
    job's (`subnet`, --network-interface) where it is in it, else its own prefix; a source among `node_ips` (every
    node's addresses) is a node's, never a stranger's (a /32 on a cloud NIC leaves every peer outside its prefix)."""
    probes = []
    for nic, address in real_addresses(addresses):
        ip = ipaddress.ip_interface(address).ip
        source = source_towards(str(ip), port)
        in_job = subnet if subnet and ip in ipaddress.ip_network(subnet) else None
        probes.append(AddressProbe(nic, address, source, cluster_subnet=in_job, from_node=source in node_ips))
    return probes


def check_node(
    image: str,
    engine: NodeEngine,
    addresses: Addresses,
    subnet: str | None = None,
    node_ips: frozenset[str] = frozenset(),
) -> PortVerdict:
    """One node's verdict: its real addresses probed from this machine where it is a stranger's vantage (outside
    their subnet, and no node)."""
    port = daemon_port(OPEN_MPI_PORTS)
    probes = probes_of(addresses, subnet, node_ips, port)
    if not any(probe.outside for probe in probes):
        return port_verdict(probes)
    cluster = f"ports-{secrets.token_hex(4)}"
    try:
        container = engine.start_probe(
            image,
            [*LINK_PROBE, "hold", "--bind", "0.0.0.0", "--port", str(port), "--seconds", str(HOLD_S)],
            name=f"horovod-stack-{cluster}-{engine.node.name}-ports",
            labels={LABEL_CLUSTER: cluster, LABEL_ROLE: "ports", LABEL_NODE: engine.node.name},
        )
        listening = engine.wait_for_output(container, '"listening"', LISTEN_S)
        if listening is None or '"listening"' not in listening:
            error = last_json(listening or "").get("error")
            if error and str(error).endswith(ADDRESS_IN_USE):
                return port_verdict(probes, busy=str(error))
            last = (listening or "").strip().splitlines()[-1:] or [f"nothing listening after {LISTEN_S:g} s"]
            return PortVerdict(False, f"the port probe did not listen: {error or last[0][:200]}", PROBE_FIX)
        probes = [replace(probe, reached=connects(probe.ip, port)) if probe.outside else probe for probe in probes]
    except NodeError as error:
        return PortVerdict(False, f"the port probe did not run: {error.detail}")
    finally:  # by label: also a container whose start an interruption cut short, before its handle came back
        engine.remove_cluster(cluster)
    return port_verdict(probes)
