"""Each rank's own NIC when a job's NIC is given as a subnet (--network-interface 10.0.0.0/24).

Open MPI takes the subnet itself; NCCL and Gloo take a NIC name, and the names may differ between hosts (ens5 on
one, eno1 on another). So every rank starts behind this: `python -m launcher.agent.rank_nic SUBNET [--keep NAMES] --
COMMAND...` finds the NIC its host has an address in SUBNET, sets NCCL's and Gloo's variables to it (over what
mpirun or horovodrun set, except the names in --keep, which the user set), and becomes COMMAND.
"""

from __future__ import annotations

import os
import subprocess
import sys

from launcher.core.nics import IP_ADDRESSES, nic_variables, own_nic, parse_ip_addresses


def host_addresses() -> list[tuple[str, str]]:
    """(NIC, address/prefix) for each IPv4 address of this host, from iproute2."""
    return parse_ip_addresses(subprocess.run(IP_ADDRESSES, capture_output=True, text=True, check=True).stdout)


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") < 1:
        print("usage: python -m launcher.agent.rank_nic SUBNET [--keep NAME,...] -- COMMAND...", file=sys.stderr)
        return 2
    options, command = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    subnet, keep = options[0], set(options[2].split(",")) if options[1:2] == ["--keep"] else set()
    addresses = host_addresses()
    nic = own_nic(subnet, addresses)
    if nic is None:
        listing = ", ".join(f"{name} {address}" for name, address in addresses)
        print(f"rank_nic: this host has no address in {subnet} (it has {listing})", file=sys.stderr)
        return 1
    for variable in nic_variables(nic):
        name, _, value = variable.partition("=")
        if name not in keep:
            os.environ[name] = value
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
