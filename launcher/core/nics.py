"""The job's network interfaces: which NIC a --network-interface value names on a host (own_nic: the one place every
side asks "which NIC is mine here"), why a node cannot use it, and the mpirun arguments and rank variables that pin
Open MPI, NCCL and Gloo to it (or leave the virtual NICs out when none is pinned). Pure functions of a host's
addresses (parse_ip_addresses reads them from `ip -o -4 addr show`, IP_ADDRESSES); no network access.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

NIC_SETTING = "NODE_NETWORK_INTERFACE"
"""The launcher's .env key for the NIC; compose's NETWORK_INTERFACE names a NIC of its containers, not the nodes'."""
VIRTUAL_NIC_PREFIXES = ("lo", "docker", "br-", "veth", "virbr")
"""NICs that never carry traffic between hosts: loopback, Docker's bridges (docker0 is 172.17.0.1 on every host, so
a rank that picks it "reaches" its own host) and their veth ends, libvirt's bridges. Across hosts with no NIC
pinned, Open MPI and NCCL are told to leave them out rather than left to pick one and hang."""


Addresses = Sequence[tuple[str, str]]
"""A host's (NIC, IPv4 address/prefix) pairs."""
IP_ADDRESSES = ("ip", "-o", "-4", "addr", "show")
"""iproute2's one line per IPv4 address of the host: `N: NIC inet ADDRESS/PREFIX ...` (parse_ip_addresses)."""


def parse_ip_addresses(text: str) -> list[tuple[str, str]]:
    """(NIC, address/prefix) pairs from IP_ADDRESSES's output, in its order."""
    pairs = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 4 and words[2] == "inet":
            pairs.append((words[1], words[3]))
    return pairs


def subnet_of(network_interface: str | None) -> str | None:
    """The subnet (CIDR) a --network-interface value names, or None where it names a NIC (or nothing)."""
    return network_interface if network_interface and "/" in network_interface else None


def own_nic(network_interface: str | None, addresses: Addresses) -> str | None:
    """Which NIC is this host's for a job's --network-interface value, given the host's addresses: the NIC named, as
    named (whether the host has it is nic_problem's question), or the first that holds an address in the subnet
    named; None where no NIC is pinned, or no address is in the subnet. The node checks and the plan, each worker's
    sshd, the link test, every rank (launcher.agent.rank_nic) and an MPIJob's launcher pod all ask it here."""
    subnet = subnet_of(network_interface)
    if not subnet:
        return network_interface or None
    network = ipaddress.ip_network(subnet)
    return next((nic for nic, address in addresses if ipaddress.ip_interface(address).ip in network), None)


def listen_addresses(addresses: Addresses, network_interface: str, reached_at: str | None) -> tuple[str, ...]:
    """Where a node's worker sshd listens when the job's NIC is pinned: that NIC's addresses (by name, or the one in
    the subnet), and the node's own address that rank 0 reaches it at (its name's), among (NIC, address/prefix)
    pairs; an address the node does not hold is left out (sshd could not bind it)."""
    nic = own_nic(network_interface, addresses)
    own = [str(ipaddress.ip_interface(address).ip) for _, address in addresses]
    chosen = [str(ipaddress.ip_interface(address).ip) for name, address in addresses if name == nic]
    if reached_at in own:
        chosen.append(reached_at)
    return tuple(dict.fromkeys(chosen))


def subnet_problem(subnet: str, addresses: Addresses) -> str | None:
    """Why a node cannot use `subnet` (no address in it), naming the addresses it has; None if it can."""
    if own_nic(subnet, addresses):
        return None
    listing = ", ".join(f"{nic} {address}" for nic, address in addresses if not address.startswith("127."))
    return (
        f"no address in {subnet} there (it has {listing or 'none'}); pass --network-interface with a subnet every "
        f"node has an address in, or set {NIC_SETTING} in .env"
    )


def nic_problem(wanted: str | None, nics: list[str] | tuple[str, ...]) -> str | None:
    """Why a node cannot use the NIC `wanted`, given the NICs it has; None if it can, or if none is asked for.
    Gloo and Horovod take one exact name (no prefix or subnet, as NCCL and Open MPI would), so it must match."""
    if not wanted or wanted in nics or subnet_of(wanted):
        return None
    return (
        f"no network interface {wanted} there (it has {', '.join(sorted(nics)) or 'none'}); pass "
        f"--network-interface with one of them, or set {NIC_SETTING} in .env"
    )


def virtual_subnets(addresses: Addresses) -> list[str]:
    """The IPv4 subnets (CIDR) of the virtual NICs (VIRTUAL_NIC_PREFIXES) among (NIC, address/prefix) pairs, sorted;
    loopback's is Open MPI's default and left out."""
    subnets = {
        str(ipaddress.ip_interface(address).network)
        for nic, address in addresses
        if nic.startswith(VIRTUAL_NIC_PREFIXES) and not ipaddress.ip_interface(address).is_loopback
    }
    return sorted(subnets, key=lambda subnet: ipaddress.ip_network(subnet))


OPEN_MPI_DEFAULT_EXCLUDE = "127.0.0.1/8"


def nic_selection(
    network_interface: str | None,
    excluded_subnets: tuple[str, ...] = (),
    across_hosts: bool = True,
    user_set: frozenset[str] = frozenset(),
) -> list[str]:
    """mpirun's arguments that choose the NICs of a job: the pinned NIC for Open MPI, NCCL and Gloo; or, across
    hosts with none pinned, the virtual NICs left out. Open MPI matches names exactly, and warns on every rank
    about a name its host lacks, so it is told the virtual NICs' subnets (found on each node before the job);
    NCCL takes prefixes after `^`, which also cover NICs that appear later. Gloo takes one name only and runs
    only in elastic jobs, which require a pinned NIC. A variable the user sets (`user_set`) is theirs."""
    if network_interface:
        # Open MPI takes a NIC name or a subnet; for a subnet, each rank finds its own host's NIC in it (RANK_NIC).
        argv = ["--mca", "btl_tcp_if_include", network_interface, "--mca", "oob_tcp_if_include", network_interface]
        if subnet_of(network_interface):
            return argv
        return argv + [word for variable in nic_variables(network_interface) for word in ("-x", variable)]
    if not across_hosts:
        return []
    argv = [] if "NCCL_SOCKET_IFNAME" in user_set else ["-x", f"NCCL_SOCKET_IFNAME=^{','.join(VIRTUAL_NIC_PREFIXES)}"]
    if excluded_subnets:
        # Setting the list replaces Open MPI's default exclusion (loopback), so loopback stays in it.
        subnets = ",".join([OPEN_MPI_DEFAULT_EXCLUDE, *excluded_subnets])
        argv = ["--mca", "btl_tcp_if_exclude", subnets, "--mca", "oob_tcp_if_exclude", subnets, *argv]
    return argv


NIC_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE")
"""What pins NCCL's and Gloo's traffic to one NIC (Open MPI's own settings are separate)."""


def nic_variables(network_interface: str | None) -> list[str]:
    """NIC_VARIABLES set to one NIC. NCCL takes a bare name as a prefix (eth0 would also match eth01); a leading `=`
    makes it exact, as Gloo's are."""
    if not network_interface:
        return []
    return [f"{name}={'=' if name.startswith('NCCL') else ''}{network_interface}" for name in NIC_VARIABLES]
