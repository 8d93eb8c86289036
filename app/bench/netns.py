"""One network namespace per rank, each with its own address and a rate-limited link, for ps-vs-ring.

Built the way tests/multihost.py builds its test hosts (namespaces on a private bridge, a veth pair each), under
names of its own so the two never meet: bridge hsbbr0, namespaces hsb-rank0.., host-side veths hsbv0..,
the NIC inside each namespace hsb0, addresses 10.213.9.10+. Each link is shaped with tc (a token bucket) in both
directions: the namespace's NIC (what the rank sends) and the host-side veth (what it receives), so every rank
has a full-duplex link of LINK_MBIT, as a host with its own NIC has.

Needs root, `ip` and `tc`. Everything is removed on exit, and leftovers of an earlier run are swept first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

BRIDGE = "hsbbr0"
SUBNET = "10.213.9"
NIC = "hsb0"
NAMESPACE_PREFIX = "hsb-rank"
VETH_PREFIX = "hsbv"
MTU = 9000
"""Jumbo frames, as in a cluster network: fewer packets for the 2-core machine to move through the bridge."""
RULE = ["FORWARD", "-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT"]


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (ip netns, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (iproute2)"
    return None


def shaping(device: str, mbit: float) -> list[str]:
    """tc arguments for a token bucket of `mbit` on device's egress; a queue deep enough that the many-to-one
    traffic of a parameter server waits rather than being dropped."""
    return ["qdisc", "replace", "dev", device, "root", "tbf", "rate", f"{mbit}mbit", "burst", "64kb", "limit", "32mb"]


@dataclass(frozen=True)
class RankHost:
    index: int

    @property
    def namespace(self) -> str:
        return f"{NAMESPACE_PREFIX}{self.index}"

    @property
    def veth(self) -> str:
        return f"{VETH_PREFIX}{self.index}"

    @property
    def address(self) -> str:
        return f"{SUBNET}.{10 + self.index}"

    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace]


class Network:
    """`with Network(8, link_mbit=200) as net:` then net.hosts[r].prefix() runs a command as rank r's host."""

    def __init__(self, count: int, link_mbit: float | None):
        self.hosts = [RankHost(index) for index in range(count)]
        self.link_mbit = link_mbit
        self.forward_rule = False

    def __enter__(self) -> Network:
        sweep()
        try:
            sh("ip", "link", "add", BRIDGE, "type", "bridge")
            sh("ip", "link", "set", BRIDGE, "up")
            # Where br_netfilter hands bridged frames to iptables and dockerd has set FORWARD to DROP.
            if shutil.which("iptables") and sh("iptables", "-C", *RULE, check=False).returncode:
                self.forward_rule = sh("iptables", "-I", *RULE, check=False).returncode == 0
            for host in self.hosts:
                sh("ip", "netns", "add", host.namespace)
                sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", NIC, "netns", host.namespace)
                sh("ip", "link", "set", host.veth, "mtu", str(MTU), "master", BRIDGE, "up")
                sh("ip", "-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", NIC)
                sh("ip", "-n", host.namespace, "link", "set", NIC, "mtu", str(MTU), "up")
                sh("ip", "-n", host.namespace, "link", "set", "lo", "up")
                if self.link_mbit:
                    sh("tc", *shaping(host.veth, self.link_mbit))
                    sh("tc", "-n", host.namespace, *shaping(NIC, self.link_mbit))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        sweep(forward_rule=self.forward_rule)


def sweep(forward_rule: bool = True) -> None:
    """Removes this module's namespaces, veths and bridge (and its FORWARD rule), whatever run left them."""
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(NAMESPACE_PREFIX):
            sh("ip", "netns", "delete", name, check=False)
    for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(VETH_PREFIX) or name == BRIDGE:
            sh("ip", "link", "delete", name, check=False)
    if forward_rule and shutil.which("iptables"):
        while sh("iptables", "-C", *RULE, check=False).returncode == 0:
            sh("iptables", "-D", *RULE, check=False)
