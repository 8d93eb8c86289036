"""One network namespace per rank, each with its own address and a rate-limited link, for ps-vs-ring and links.

Built the way tests/multihost.py builds its test hosts (namespaces on a private bridge, a veth pair each), under
names of its own so the two never meet: for ps-vs-ring (PS_VS_RING) bridge hsbbr0, namespaces hsb-rank0..,
host-side veths hsbv0.., the NIC inside each namespace hsb0, addresses 10.213.9.10+; the links bench has its own set
(LINKS: hslbr0, hsl-rank0.., 10.213.10.10+), so the two benches (and their CI runs) never sweep each other's. Each
link is shaped with tc (a token bucket) in both directions: the namespace's NIC (what the rank sends) and the
host-side veth (what it receives), so every rank has a full-duplex link of LINK_MBIT, as a host with its own NIC has.
The bridge has an address of its own (subnet .1), where ranks in namespaces reach this host's mpirun daemon.

Needs root, `ip` and `tc`. Everything is removed on exit, and leftovers of an earlier run are swept first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

NIC = "hsb0"
"""The NIC inside every rank's namespace (both sets)."""
MTU = 9000
"""Jumbo frames, as in a cluster network: fewer packets for the 2-core machine to move through the bridge."""


@dataclass(frozen=True)
class Names:
    """One bench's bridge, subnet (first three octets), namespace and host-side veth prefixes."""

    bridge: str
    subnet: str
    namespace_prefix: str
    veth_prefix: str

    @property
    def host_address(self) -> str:
        """The bridge's own address, where the ranks reach this host (mpirun's daemon: MPI_ENV)."""
        return f"{self.subnet}.1"

    @property
    def rule(self) -> list[str]:
        """The FORWARD rule that lets bridged frames through where dockerd set FORWARD to DROP."""
        return ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]


PS_VS_RING = Names("hsbbr0", "10.213.9", "hsb-rank", "hsbv")
LINKS = Names("hslbr0", "10.213.10", "hsl-rank", "hslv")


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def mpi_rank_wrapper(names: Names) -> list[str]:
    """Words before an mpirun rank's command that run it in its own rank's namespace (Open MPI's rank number picks
    the namespace): mpirun and its daemon stay on the host, each rank's traffic goes over its shaped link."""
    return ["sh", "-c", f'exec ip netns exec {names.namespace_prefix}"$OMPI_COMM_WORLD_RANK" "$@"', "sh"]


MPI_OVER_NIC = ["--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", NIC]
"""mpirun's options for ranks in namespaces: Open MPI's TCP transport over each namespace's NIC, not shared memory
(which would carry the ranks' data past the shaped links, since every rank is on this one host)."""


def mpi_env(names: Names) -> dict[str, str]:
    """mpirun's environment for ranks in namespaces: its daemon's PMIx server, which a rank joins at MPI_Init over
    TCP on loopback by default (another namespace's loopback is not this host's), listens on the bridge's address
    instead (a few kilobytes at start and end; the data goes rank to rank)."""
    return {"PMIX_MCA_ptl_tcp_if_include": names.bridge, "PMIX_MCA_ptl_tcp_remote_connections": "1"}


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (ip netns, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (iproute2)"
    return None


DEEP_QUEUE = "32mb"


def shaping(device: str, mbit: float, queue: str = DEEP_QUEUE) -> list[str]:
    """tc arguments for a token bucket of `mbit` on device's egress, its queue `queue` deep (by default deep enough
    that the many-to-one traffic of a parameter server waits rather than being dropped)."""
    return ["qdisc", "replace", "dev", device, "root", "tbf", "rate", f"{mbit}mbit", "burst", "64kb", "limit", queue]


@dataclass(frozen=True)
class RankHost:
    index: int
    names: Names = PS_VS_RING

    @property
    def namespace(self) -> str:
        return f"{self.names.namespace_prefix}{self.index}"

    @property
    def veth(self) -> str:
        return f"{self.names.veth_prefix}{self.index}"

    @property
    def address(self) -> str:
        return f"{self.names.subnet}.{10 + self.index}"

    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace]


class Network:
    """`with Network(8, link_mbit=200) as net:` then net.hosts[r].prefix() runs a command as rank r's host."""

    def __init__(self, count: int, link_mbit: float | None, names: Names = PS_VS_RING, queue: str = DEEP_QUEUE):
        self.names, self.queue = names, queue
        self.hosts = [RankHost(index, names) for index in range(count)]
        self.link_mbit = link_mbit
        self.forward_rule = False

    def __enter__(self) -> Network:
        names = self.names
        sweep(names)
        try:
            sh("ip", "link", "add", names.bridge, "type", "bridge")
            sh("ip", "addr", "add", f"{names.host_address}/24", "dev", names.bridge)
            sh("ip", "link", "set", names.bridge, "up")
            # Where br_netfilter hands bridged frames to iptables and dockerd has set FORWARD to DROP.
            if shutil.which("iptables") and sh("iptables", "-C", *names.rule, check=False).returncode:
                self.forward_rule = sh("iptables", "-I", *names.rule, check=False).returncode == 0
            for host in self.hosts:
                sh("ip", "netns", "add", host.namespace)
                sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", NIC, "netns", host.namespace)
                sh("ip", "link", "set", host.veth, "mtu", str(MTU), "master", names.bridge, "up")
                sh("ip", "-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", NIC)
                sh("ip", "-n", host.namespace, "link", "set", NIC, "mtu", str(MTU), "up")
                sh("ip", "-n", host.namespace, "link", "set", "lo", "up")
            if self.link_mbit:
                self.shape(self.link_mbit)
        except BaseException:
            self.__exit__()
            raise
        return self

    def shape(self, mbit: float) -> None:
        """Every rank's link limited to `mbit` each way (replacing any earlier rate): one network, several rates."""
        for host in self.hosts:
            sh("tc", *shaping(host.veth, mbit, self.queue))
            sh("tc", "-n", host.namespace, *shaping(NIC, mbit, self.queue))
        self.link_mbit = mbit

    def __exit__(self, *_exc: object) -> None:
        sweep(self.names, forward_rule=self.forward_rule)


def sweep(names: Names = PS_VS_RING, forward_rule: bool = True) -> None:
    """Removes one bench's namespaces, veths and bridge (and its FORWARD rule), whatever run left them."""
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(names.namespace_prefix):
            sh("ip", "netns", "delete", name, check=False)
    for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(names.veth_prefix) or name == names.bridge:
            sh("ip", "link", "delete", name, check=False)
    if forward_rule and shutil.which("iptables"):
        while sh("iptables", "-C", *names.rule, check=False).returncode == 0:
            sh("iptables", "-D", *names.rule, check=False)
