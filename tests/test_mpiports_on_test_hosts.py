"""Open MPI's ports on the test hosts of tests/multihost.py: `launcher doctor` from this machine, inside the nodes'
subnet, cannot tell and says so; from an address outside it (a second address of this machine, 10.213.99.1, that
node_1 is reached from) it says node_1's range is reached, with the firewall rule; once node_1's namespace holds that
very rule it says not reached. A fixed-size 2-node job trains with every Open MPI listener inside the range (`ss
-ltnp` in both nodes' namespaces while it runs). The pure parts: tests/test_mpiports.py."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.core.mpiports import OPEN_MPI_PORTS
from tests.multihost import NIC, Cluster, TestNode, sh

pytestmark = pytest.mark.integration

IMAGE = os.environ.get("IMAGE", "horovod-stack:latest")
LAUNCHER = str(Path(sys.executable).parent / "launcher")
OUTSIDE = "10.213.99.1"
"""This machine's second address, outside the nodes' subnet: a stranger's vantage on node_1."""


@pytest.fixture(scope="module")
def cluster(test_hosts: Cluster) -> Cluster:
    for node in test_hosts.nodes:
        test_hosts.ensure_image(IMAGE, node)
    return test_hosts


def doctor(cluster: Cluster) -> subprocess.CompletedProcess:
    return subprocess.run(
        [LAUNCHER, "doctor", "--env-file", str(cluster.env_file())],
        env=cluster.launcher_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def port_line(output: str, node: str) -> str:
    [line] = [line for line in output.splitlines() if line.startswith(f"{node}: mpi ports")]
    return line


@contextlib.contextmanager
def reached_from_outside(cluster: Cluster, node: TestNode) -> Iterator[None]:
    """This machine talks to `node` from OUTSIDE (its own route and the node's way back); undone on exit."""
    bridge = cluster.network.bridge
    steps = [
        (["ip", "addr", "add", f"{OUTSIDE}/32", "dev", bridge], ["ip", "addr", "del", f"{OUTSIDE}/32", "dev", bridge]),
        (
            ["ip", "-n", node.namespace, "route", "add", f"{OUTSIDE}/32", "dev", NIC],
            ["ip", "-n", node.namespace, "route", "del", f"{OUTSIDE}/32", "dev", NIC],
        ),
        (
            ["ip", "route", "add", f"{node.address}/32", "dev", bridge, "src", OUTSIDE],
            ["ip", "route", "del", f"{node.address}/32", "dev", bridge],
        ),
    ]
    undo = []
    try:
        for do, undo_step in steps:
            sh(*do)
            undo.append(undo_step)
        yield
    finally:
        for undo_step in reversed(undo):
            sh(*undo_step, check=False)


def test_doctor_says_whether_an_address_outside_the_subnet_reaches_open_mpis_ports(cluster, measured):
    node_1, node_2 = cluster.nodes
    subnet = f"{cluster.network.subnet}.0/24"
    inside = doctor(cluster)
    assert inside.returncode == 0, inside.stdout + inside.stderr
    for node in cluster.nodes:
        assert port_line(inside.stdout, node.name) == (
            f"{node.name}: mpi ports     note a fixed-size job's Open MPI listens on TCP {OPEN_MPI_PORTS} on every "
            "address; cannot tell from here whether an address outside its subnet reaches them: this machine is "
            f"inside its subnets ({cluster.bridge_address} in {subnet})"
        )
    rule = f"iptables -A INPUT -i {NIC} -p tcp --dport 12350:12605 ! -s {subnet} -j DROP"
    with reached_from_outside(cluster, node_1):
        started = time.monotonic()
        reached = doctor(cluster)
        measured(f"doctor with node_1's Open MPI port probed from outside took {time.monotonic() - started:.1f} s")
        print(reached.stdout)
        assert reached.returncode == 1, reached.stdout + reached.stderr
        assert port_line(reached.stdout, "node_1") == (
            f"node_1: mpi ports     FAIL a fixed-size job's Open MPI listens on TCP {OPEN_MPI_PORTS} on every "
            f"address; {node_1.address} ({NIC}) reached from {OUTSIDE} (outside {subnet}); firewall it on that node: "
            f"{rule}"
        )
        assert "note" in port_line(reached.stdout, "node_2")  # still reached from inside its subnet
        sh(*node_1.in_namespace(*shlex.split(rule)))  # the fix, as doctor gave it
        try:
            started = time.monotonic()
            firewalled = doctor(cluster)
            measured(f"doctor with node_1's range firewalled took {time.monotonic() - started:.1f} s")
        finally:
            sh(*node_1.in_namespace(*shlex.split(rule.replace(" -A ", " -D "))), check=False)
    print(firewalled.stdout)
    assert firewalled.returncode == 0, firewalled.stdout + firewalled.stderr
    assert port_line(firewalled.stdout, "node_1") == (
        f"node_1: mpi ports     ok a fixed-size job's Open MPI listens on TCP {OPEN_MPI_PORTS} on every address; "
        f"{node_1.address} ({NIC}) not reached from {OUTSIDE}, outside its subnet"
    )
    assert "all nodes ready" in firewalled.stdout
    for node in (node_1, node_2):  # the probe's container is gone
        assert node.client().containers.list(all=True, filters={"label": "horovod-stack.role=ports"}) == []


def listening(node: TestNode) -> list[tuple[str, int, str]]:
    """(address, port, process) of every TCP socket listening in the node's namespace."""
    lines = subprocess.run(node.in_namespace("ss", "-Hltnp"), capture_output=True, text=True, check=True).stdout
    sockets = []
    for line in lines.splitlines():
        words = line.split()
        address, port = words[3].rsplit(":", 1)
        sockets.append((address, int(port), words[-1]))
    return sockets


def test_a_fixed_size_job_trains_with_every_open_mpi_listener_in_the_range(cluster, tmp_path, measured):
    log = tmp_path / "launcher.log"
    job = ["start", "--env-file", str(cluster.env_file()), "--", "--dataset", "synthetic", "--epochs", "4"]
    with open(log, "w") as out:
        process = subprocess.Popen([LAUNCHER, *job], env=cluster.launcher_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while "epoch 1/4:" not in log.read_text():
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        seen = {node.name: listening(node) for node in cluster.nodes}
        process.wait(timeout=400)
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=120)
    output = log.read_text()
    assert process.returncode == 0, output[-5000:]
    for name, sockets in seen.items():
        print(f"listening on {name} during the job:\n" + "\n".join(f"  {a}:{p} {who}" for a, p, who in sockets))
        open_mpi = [(a, p, who) for a, p, who in sockets if '"sshd"' not in who and a not in ("127.0.0.1", "[::1]")]
        outside = [(a, p, who) for a, p, who in open_mpi if p not in OPEN_MPI_PORTS]
        measured(f"{name}: {len(open_mpi)} Open MPI listener(s), ports {sorted({p for _, p, _ in open_mpi})}")
        assert outside == [], sockets
        daemon = "mpirun" if name == "node_1" else "orted"
        assert (daemon, OPEN_MPI_PORTS.first) in {(who.split('"')[1], p) for _, p, who in open_mpi}, sockets
        assert sum('"python' in who for _, _, who in open_mpi) >= 2, sockets  # the rank's IPv4 and IPv6 listeners
