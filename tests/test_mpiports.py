"""Open MPI's listening ports in a fixed-size job: the range and mpirun's arguments that pin them (one home, in every
job's mpirun line), doctor's verdict per node (table), its network side over loopback (the hold listener, the route's
source address, the connect) and its flow with a stand-in engine. On the test hosts, with a real firewall and a real
job: tests/test_mpiports_on_test_hosts.py."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from launcher.agent import linkprobe
from launcher.core.jobspec import mpirun_argv
from launcher.core.mpiports import (
    OPEN_MPI_PORTS,
    RANKS_PER_NODE_MAX,
    AddressProbe,
    PortRange,
    daemon_port,
    firewall_line,
    port_selection,
    port_verdict,
    ranks_problem,
)
from launcher.host.doctor import portcheck
from launcher.host.planning import preflight
from launcher.host.planning.plan import LABEL_CLUSTER
from launcher.host.planning.preflight import HostView, NodeFacts, Severity
from tests.conftest import launch_settings
from tests.standins import StandInEngine


def mca(argv: list[str]) -> dict[str, int]:
    return {argv[i + 1]: int(argv[i + 2]) for i in range(len(argv)) if argv[i] == "--mca"}


def test_port_selection_pins_the_daemons_and_both_families_of_the_ranks_to_disjoint_parts_of_the_range():
    settings = mca(port_selection(PortRange(20000, 20009)))
    assert settings == {
        "oob_tcp_static_ipv4_ports": 20000,
        "oob_tcp_static_ipv6_ports": 20001,
        "btl_tcp_port_min_v4": 20002,
        "btl_tcp_port_range_v4": 4,
        "btl_tcp_port_min_v6": 20006,
        "btl_tcp_port_range_v6": 4,
    }


def test_the_default_range_holds_every_listener_and_each_port_once():
    settings = mca(port_selection())
    used = [settings["oob_tcp_static_ipv4_ports"], settings["oob_tcp_static_ipv6_ports"]]
    for family in ("v4", "v6"):
        first = settings[f"btl_tcp_port_min_{family}"]
        used += range(first, first + settings[f"btl_tcp_port_range_{family}"])
    assert sorted(used) == list(range(OPEN_MPI_PORTS.first, OPEN_MPI_PORTS.last + 1))
    assert len(set(used)) == OPEN_MPI_PORTS.size and RANKS_PER_NODE_MAX == 127
    assert 12345 not in OPEN_MPI_PORTS  # the workers' sshd port by default
    assert daemon_port() == OPEN_MPI_PORTS.first


@pytest.mark.parametrize("network_interface", [None, "eth0", "10.0.0.0/24"])
def test_every_mpirun_line_carries_the_port_selection(network_interface):
    argv = mpirun_argv(ranks=2, hostfile="/h", command=["python", "x.py"], network_interface=network_interface)
    words = " ".join(argv)
    assert " ".join(port_selection()) in words
    assert words.index("oob_tcp_static_ipv4_ports") < words.index("x.py")


def probe(address: str, source: str | None, reached: bool | None = None, nic: str = "eno1") -> AddressProbe:
    return AddressProbe(nic, address, source, reached)


LISTENS = "a fixed-size job's Open MPI listens on TCP 12350-12605 on every address"
RULE = "iptables -A INPUT -i eno1 -p tcp --dport 12350:12605 ! -s 10.0.0.0/24 -j DROP"


@pytest.mark.parametrize(
    ("probes", "busy", "ok", "said", "what", "fix"),
    [
        (
            [probe("10.0.0.11/24", "192.0.2.2", True)],
            None,
            False,
            True,
            f"{LISTENS}; 10.0.0.11 (eno1) reached from 192.0.2.2 (outside 10.0.0.0/24)",
            f"firewall it on that node: {RULE}",
        ),
        (
            [probe("10.0.0.11/24", "192.0.2.2", False)],
            None,
            True,
            True,
            f"{LISTENS}; 10.0.0.11 (eno1) not reached from 192.0.2.2, outside its subnet",
            "",
        ),
        (
            [probe("10.0.0.11/24", "10.0.0.1")],
            None,
            True,
            False,
            f"{LISTENS}; cannot tell from here whether an address outside its subnet reaches them: this machine is "
            "inside its subnets (10.0.0.1 in 10.0.0.0/24)",
            "",
        ),
        (
            [probe("10.0.0.11/24", None)],
            None,
            True,
            False,
            f"{LISTENS}; cannot tell from here whether an address outside its subnet reaches them: no route from "
            "this machine",
            "",
        ),
        (  # one NIC firewalled, the other open: the open one is named, with its own rule
            [probe("10.0.0.11/24", "192.0.2.2", False), probe("203.0.113.5/24", "192.0.2.2", True, nic="eno2")],
            None,
            False,
            True,
            f"{LISTENS}; 203.0.113.5 (eno2) reached from 192.0.2.2 (outside 203.0.113.0/24)",
            "firewall it on that node: " + firewall_line("eno2", "203.0.113.0/24"),
        ),
        (
            [probe("10.0.0.11/24", "192.0.2.2")],
            "[Errno 98] Address already in use",
            False,
            True,
            f"{LISTENS}; port 12350 is taken ([Errno 98] Address already in use)",
            "free it on that node",
        ),
    ],
)
def test_port_verdict(probes, busy, ok, said, what, fix):
    verdict = port_verdict(probes, busy)
    assert (verdict.ok, verdict.said, verdict.what, verdict.fix) == (ok, said, what, fix)


def test_firewall_line_names_the_exact_ports():
    assert firewall_line("eno1", "10.0.0.0/24") == RULE


def test_a_probe_is_outside_only_where_its_source_is_not_in_the_addresss_subnet():
    assert probe("10.0.0.11/24", "192.0.2.2").outside
    assert not probe("10.0.0.11/24", "10.0.0.99").outside
    assert not probe("10.0.0.11/24", None).outside


def test_real_addresses_leave_out_loopback_and_virtual_nics():
    addresses = [("lo", "127.0.0.1/8"), ("docker0", "172.17.0.1/16"), ("eno1", "10.0.0.11/24"), ("veth1", "1.2.3.4/32")]
    assert portcheck.real_addresses(addresses) == [("eno1", "10.0.0.11/24")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_hold_accepts_every_connect_until_its_time_is_up_and_names_the_peers(capsys):
    port = free_port()
    result: dict = {}
    thread = threading.Thread(
        target=lambda: result.update(code=linkprobe.main(["hold", "--port", str(port), "--seconds", "1"]))
    )
    started = time.monotonic()
    thread.start()
    deadline = time.monotonic() + 5
    while not portcheck.connects("127.0.0.1", port):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert portcheck.connects("127.0.0.1", port)
    thread.join(timeout=5)
    assert result == {"code": 0} and time.monotonic() - started < 3
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0] == {"listening": f"0.0.0.0:{port}"} and lines[-1]["peers"][-2:] == ["127.0.0.1", "127.0.0.1"]
    assert not portcheck.connects("127.0.0.1", port)


def test_hold_on_a_taken_port_says_why_and_fails(capsys):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert linkprobe.main(["hold", "--port", str(port), "--seconds", "1"]) == 1
    assert json.loads(capsys.readouterr().out) == {"error": "[Errno 98] Address already in use"}


def test_the_source_towards_an_address_is_the_routes_choice():
    assert portcheck.source_towards("127.0.0.1", 9) == "127.0.0.1"


def test_check_node_probes_only_from_outside_and_removes_its_container(monkeypatch):
    engine = StandInEngine("node_1")
    sources = {"10.0.0.11": "192.0.2.2", "10.1.0.11": "10.1.0.1"}
    monkeypatch.setattr(portcheck, "source_towards", lambda address, port: sources[address])
    tried: list[tuple[str, int]] = []

    def connects(address: str, port: int) -> bool:
        tried.append((address, port))
        return True

    monkeypatch.setattr(portcheck, "connects", connects)
    addresses = (("lo", "127.0.0.1/8"), ("eno1", "10.0.0.11/24"), ("eno2", "10.1.0.11/24"))
    verdict = portcheck.check_node("img", engine, addresses)
    assert tried == [("10.0.0.11", 12350)]  # eno2's subnet holds this machine: not a stranger's vantage
    assert not verdict.ok and "10.0.0.11 (eno1) reached from 192.0.2.2 (outside 10.0.0.0/24)" in verdict.what
    [(argv, labels)] = engine.probes
    assert argv[3:] == ["hold", "--bind", "0.0.0.0", "--port", "12350", "--seconds", "120.0"]
    assert engine.removed == [labels[LABEL_CLUSTER]]


def test_check_node_starts_nothing_where_this_machine_is_inside_every_subnet(monkeypatch):
    engine = StandInEngine("node_1")
    monkeypatch.setattr(portcheck, "source_towards", lambda address, port: "10.0.0.1")
    verdict = portcheck.check_node("img", engine, (("eno1", "10.0.0.11/24"),))
    assert verdict.ok and not verdict.said and engine.probes == [] and engine.removed == []


@pytest.mark.parametrize(
    ("ranks", "problem"),
    [
        (1, None),
        (127, None),
        (128, "128 ranks there, and Open MPI's ports (12350-12605) hold 127 a node; run at most 127 (--slots)"),
    ],
)
def test_ranks_problem(ranks, problem):
    assert ranks_problem(ranks) == problem


@pytest.mark.parametrize(("elastic", "blocked"), [(False, True), (True, False)])
def test_a_fixed_size_job_with_more_ranks_on_a_node_than_the_range_holds_is_refused_before_it_starts(elastic, blocked):
    view = HostView(port_taken=False, nics=("lo", "eth0"), addresses=(("eth0", "10.0.0.11/24"),))
    facts = NodeFacts("node_1", "ssh://node_1", image_id="sha256:1", view=view)
    extra = {"elastic_min_workers": 1, "network_interface": "eth0"} if elastic else {}
    settings = launch_settings(nodes=("node_1",), slots=200, elastic=elastic, **extra)
    found = [finding for finding in preflight.host_findings(settings, facts) if finding.check == "mpi ports"]
    assert [finding.severity for finding in found] == ([Severity.BLOCKING] if blocked else [])


@pytest.mark.parametrize(
    ("output", "ok", "what", "fix"),
    [
        (
            '{"error": "[Errno 98] Address already in use"}\n',
            False,
            f"{LISTENS}; port 12350 is taken ([Errno 98] Address already in use)",
            "free it on that node",
        ),
        (  # an image older than the launcher: its linkprobe has no `hold`
            "usage: python -m launcher.agent.linkprobe [-h]\n"
            "python -m launcher.agent.linkprobe: error: argument role: invalid choice: 'hold'\n",
            False,
            "the port probe did not listen: python -m launcher.agent.linkprobe: error: argument role: invalid choice: "
            "'hold'",
            portcheck.PROBE_FIX,
        ),
    ],
)
def test_check_node_where_the_probe_does_not_listen(monkeypatch, output, ok, what, fix):
    engine = StandInEngine("node_1")
    monkeypatch.setattr(engine, "wait_for_output", lambda container, text, timeout: output)
    monkeypatch.setattr(portcheck, "source_towards", lambda address, port: "192.0.2.2")
    verdict = portcheck.check_node("img", engine, (("eno1", "10.0.0.11/24"),))
    assert (verdict.ok, verdict.what, verdict.fix) == (ok, what, fix)
    assert len(engine.removed) == 1


def test_a_node_is_no_stranger_and_the_jobs_subnet_is_the_clusters(monkeypatch):
    """A /32 on a cloud NIC leaves every peer outside the address's own prefix: doctor run on another node is told
    apart by the nodes' addresses; a --network-interface subnet is the cluster's, whatever the NIC's prefix."""
    sources = {"10.0.0.11": "10.0.0.12", "10.9.1.11": "10.0.0.99"}
    monkeypatch.setattr(portcheck, "source_towards", lambda address, port: sources[address])
    addresses = (("eno1", "10.0.0.11/32"), ("eno2", "10.9.1.11/24"))
    probes = portcheck.probes_of(addresses, "10.0.0.0/16", frozenset({"10.0.0.11", "10.0.0.12"}), 12350)
    assert [(probe.subnet, probe.from_node, probe.outside) for probe in probes] == [
        ("10.0.0.0/16", True, False),
        ("10.9.1.0/24", False, True),
    ]
    verdict = port_verdict([probes[0]])
    assert not verdict.said and verdict.what.endswith("this machine is one of the nodes (10.0.0.12)")
