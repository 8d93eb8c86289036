"""An elastic job's rank-0 node, scanned by a stranger on the job's network (the test hosts of tests/multihost.py:
this machine's own address on their bridge is outside the job): nothing of the job listens on a wildcard address,
the rendezvous refuses every request without the job's secret (403, and one line in the job's output naming the
sender), a pickle sent to every listening port runs nothing, a flood of rank 0's notification service costs it a
bounded number of threads and little memory, and the job finishes as if no one had asked. The rules and the server
alone: tests/test_rendezvous_guard.py. And the job's secret reaches a remote rank however large the environment is
(it travels with the rest over the ssh channel's stdin: docker/horovod-runner/env_channel.py)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.logwait import wait_for_line
from tests.multihost import Cluster

pytestmark = pytest.mark.integration

IMAGE = os.environ.get("IMAGE", "horovod-stack:latest")
LAUNCHER = str(Path(sys.executable).parent / "launcher")
USER_SCRIPT = Path(__file__).parent / "user_script"
PROBE = USER_SCRIPT / "rendezvous_probe.py"
MARKER = "/tmp/hst-rendezvous-ran-code"
WILDCARDS = ("0.0.0.0:", "*:", "[::]:")
FLOOD = USER_SCRIPT / "notification_flood.py"
STRANGERS_CONNECTIONS = 2000
HELD_SECONDS = 6.0


@pytest.fixture(scope="module")
def cluster(test_hosts: Cluster) -> Cluster:
    for node in test_hosts.nodes:
        test_hosts.ensure_image(IMAGE, node)
    return test_hosts


def threads_and_memory(pid: int) -> tuple[int, int]:
    """A process's thread count and resident memory (bytes), from /proc."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status["Threads"]), int(status["VmRSS"].split()[0]) * 1024


def flood_the_notification_service(local: str, who: str, measured) -> None:
    """A stranger's lengths of -1 and 1 GiB, then 2,000 idle connections held, against a rank's notification
    service: each length closed at once, and the rank grows by at most MAX_CONNECTIONS threads (and a few of its
    own) while they are held. Its memory is a figure printed beside the same time without the stranger, not an
    assertion: a training rank's own allocations (an epoch's end, a checkpoint) move it by tens of MiB on a loaded
    machine; the service's memory bound is asserted where nothing else allocates, tests/test_rendezvous_guard.py."""
    from horovod.runner.common.util.stack_guard import MAX_CONNECTIONS  # the runner's patch, as the image has it

    address, port = local.rsplit(":", 1)
    pid = int(re.search(r"pid=(\d+)", who).group(1))  # type: ignore[union-attr]
    quiet = threads_and_memory(pid)
    time.sleep(HELD_SECONDS)  # the same time without the stranger, to tell the flood from the rank's own growth
    threads, memory = threads_and_memory(pid)
    flood = subprocess.Popen(
        [sys.executable, str(FLOOD), address, port, str(STRANGERS_CONNECTIONS), "5"], stdout=subprocess.PIPE, text=True
    )
    try:
        opened = json.loads(flood.stdout.readline())  # type: ignore[union-attr]
        time.sleep(max(0.5, HELD_SECONDS - opened["seconds"]))
        held_threads, held_memory = threads_and_memory(pid)
    finally:
        flood.wait(timeout=60)
    grown_threads, grown_memory = held_threads - threads, held_memory - memory
    measured(
        f"a stranger's {opened['held']} idle connections (opened in {opened['seconds']} s) to rank 0's notification "
        f"service, {HELD_SECONDS} s: {grown_threads:+d} threads, {grown_memory / 2**20:+.1f} MiB (without them: "
        f"{threads - quiet[0]:+d}, {(memory - quiet[1]) / 2**20:+.1f} MiB); lengths -1 and 1 GiB closed at once: "
        f"{opened['closed_at_once']}"
    )
    assert opened == {**opened, "closed_at_once": [True, True], "held": STRANGERS_CONNECTIONS}, opened
    assert grown_threads <= MAX_CONNECTIONS + 4, grown_threads


def test_a_stranger_gets_nothing_from_an_elastic_jobs_rank_0_node_and_the_job_finishes(cluster, tmp_path, measured):
    log = tmp_path / "launcher.log"
    job = [
        "start",
        "--env-file",
        str(cluster.env_file()),
        "--elastic",
        "--min-nodes",
        "2",
        "--",
        "--dataset",
        "synthetic",
        "--epochs",
        "24",  # the flood waits for epoch 5 (a rank's memory grows in its first epochs) and ends before the last
    ]
    with open(log, "w") as out:
        process = subprocess.Popen([LAUNCHER, *job], env=cluster.launcher_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_line(log, "epoch 1/", process, timeout=300)
        sockets = [(f"{address}:{port}", who) for address, port, who in cluster.nodes[0].listening()]
        print("listening on node_1 during the job:\n" + "\n".join(f"  {local} {who}" for local, who in sockets))
        assert [local for local, _ in sockets if local.startswith(WILDCARDS)] == [], sockets
        ports = sorted({int(local.rsplit(":", 1)[1]) for local, _ in sockets})
        probe = subprocess.run(
            [sys.executable, str(PROBE), cluster.nodes[0].address, MARKER, *map(str, ports)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        where = {local.rsplit(":", 1)[1]: local for local, _ in sockets}
        answers = {where[port]: got for port, got in json.loads(probe.stdout).items()}
        measured(f"rendezvous probe of node_1's {len(ports)} listening ports: {answers}")
        assert [port for port, got in answers.items() if got == ["403", "403", "403"]], answers  # the rendezvous
        assert not [port for port, got in answers.items() if "200" in got], answers
        notification = [(local, who) for local, who in sockets if '"python' in who and answers[local] != ["403"] * 3]
        assert len(notification) == 1, (notification, answers)  # rank 0's notification service
        wait_for_line(log, "epoch 5/", process, timeout=300)
        flood_the_notification_service(*notification[0], measured)
        rank0 = cluster.nodes[0].client().containers.list(filters={"label": "horovod-stack.node=node_1"})
        assert len(rank0) == 1 and rank0[0].exec_run(["test", "-d", "/tmp"]).exit_code == 0  # the check's control
        assert rank0[0].exec_run(["test", "-e", MARKER]).exit_code == 1, "a stranger's pickle ran in rank 0's container"
        process.wait(timeout=400)
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=120)
    output = log.read_text()
    assert process.returncode == 0, output[-5000:]
    refused = f"horovod-stack: refused a rendezvous request from {cluster.bridge_address} (PUT "
    assert refused in output, output[-5000:]
    assert cluster.project_containers() == {node.name: [] for node in cluster.every_node}


def test_an_elastic_jobs_remote_rank_gets_140_env_values_and_the_secret(cluster):
    """sshd takes at most 128 variables a session from a client and ignores the rest: over ssh's SendEnv the remote
    rank of this job got 107 of the 140 --env values (and the job's secret only where it came early). Every rank sees
    all of them and the secret now, and the job exits 0."""
    count, value = 140, f"sk-SECRET-{os.urandom(8).hex()}"
    probe_values = [f'--env=HST_PROBE_{i}=value {i} it\'s "quoted"' for i in range(count)]
    job = [
        *("start", "--env-file", str(cluster.env_file()), "--workdir", str(USER_SCRIPT)),
        *("--elastic", "--min-nodes", "2", "--secret", "API_KEY", *probe_values),
        *("--", "python", "environment_probe.py", "HST_PROBE", str(count), "API_KEY"),
    ]
    done = subprocess.run(
        [LAUNCHER, *job],
        env={**cluster.launcher_env(), "API_KEY": value},
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    line = r"environment of rank (\d+) on (\S+): (\d+) of \d+ --env values right; API_KEY sha256 (\w+); "
    line += r"zombies of ssh (\d+)"
    seen = re.findall(line, output)
    print(f"what each rank saw: {seen}")
    digest = hashlib.sha256(value.encode()).hexdigest()
    assert len({host for _, host, *_ in seen}) == 2, output[-5000:]  # a rank on each node: one is remote
    assert sorted(seen) == sorted((rank, host, str(count), digest, "0") for rank, host, *_ in seen), output[-5000:]
    assert done.returncode == 0, output[-5000:]
    assert value not in output
    assert cluster.project_containers() == {node.name: [] for node in cluster.every_node}
