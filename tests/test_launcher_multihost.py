"""`launcher` across two real Docker hosts (network namespaces, each with its own dockerd and address).

Each test finds the nodes as it needs them (fixtures: `bare`, no image anywhere; `cluster`, the image on both nodes,
hard-linked from this machine's engine) and leaves nothing behind however it ends. Each failure case asserts a
one-line error, a non-zero exit and no container left on either node.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import docker
import pytest

from app import rank_error
from launcher.core.protocol import LOST_PREFIX, SILENCE_SECONDS, lost_driver_message
from launcher.host.running import jobstate
from tests.multihost import SHARED_HOST_NAME, Cluster
from tests.test_examples import launch_example_as_typed

pytestmark = pytest.mark.integration

IMAGE = os.environ.get("IMAGE", "horovod-stack:latest")
LAUNCHER = str(Path(sys.executable).parent / "launcher")
TRAIN = ["--", "--dataset", "digits", "--epochs", "5", "--summary-file", "/shared/runs/summary.json"]
LONG_TRAIN = ["--", "--dataset", "synthetic", "--epochs", "200"]
USER_SCRIPT = Path(__file__).parent / "user_script"


def sweep(hosts: Cluster) -> None:
    """Every job and container of the stack on every node removed: `launcher stop`, then whatever it could not see."""
    launcher(hosts, "stop", "--env-file", str(hosts.env_file()), timeout=180)
    for node in hosts.every_node:
        for container in node.client().containers.list(all=True, filters={"label": "horovod-stack.cluster"}):
            container.remove(force=True)


@pytest.fixture
def bare(test_hosts: Cluster):
    """The shared test hosts with no image on any node, as a user's first start finds them: the first test refuses
    them for lacking it; the second gives them an earlier build and pushes a new one to both at once (one export, two
    loads, only the new layer). (A push of the whole image to a spare that lacks it, and a pull from a registry, have
    test hosts of their own in the other group: tests/test_image_delivery.py.)"""
    for node in test_hosts.every_node:
        if test_hosts.has_image(IMAGE, node):  # another module or test put it there
            node.client().images.remove(IMAGE, force=True)
    yield test_hosts
    sweep(test_hosts)


@pytest.fixture
def cluster(test_hosts: Cluster):
    """The shared test hosts with the image on node_1 and node_2 (hard-linked from this machine's engine in seconds:
    tests/multihost.py's link_image), and nothing of the stack left on any node after the test however it ends, so
    one failure fails nothing after it."""
    for node in test_hosts.nodes:
        test_hosts.ensure_image(IMAGE, node)
    yield test_hosts
    sweep(test_hosts)


@pytest.fixture
def spare(cluster: Cluster):
    """node_3, holding the image (linked as node_1's and node_2's are; the push to a spare is tested on hosts of its
    own)."""
    node = cluster.spares[0]
    cluster.ensure_image(IMAGE, node)
    return node


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def default_signal_dispositions() -> None:
    """In the launcher's process: the signals it is tested with act as they do from a terminal, whatever this test
    run inherited (a background job or nohup ignores SIGINT or SIGHUP, and children would inherit that)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def launcher(cluster: Cluster, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [LAUNCHER, *args],
        env=cluster.launcher_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=default_signal_dispositions,
    )


def start_args(cluster: Cluster, *extra: str) -> list[str]:
    return ["start", "--env-file", str(cluster.env_file()), *extra]


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


def assert_nothing_left(cluster: Cluster) -> None:
    assert cluster.project_containers() == {node.name: [] for node in cluster.every_node}


def test_node_without_image_is_refused(bare):
    cluster = bare
    result = launcher(cluster, *start_args(cluster), *TRAIN)
    assert result.returncode == 1
    assert error_lines(result) == [
        "error: node_1: image horovod-stack:latest is not there; pass --push-image to "
        "copy it from this machine's engine, load it on that node, or name it in a "
        "registry (IMAGE=USER/NAME:TAG on Docker Hub, or REGISTRY/NAME:TAG)"
    ]
    assert_nothing_left(cluster)


@pytest.fixture
def new_build(tmp_path: Path):
    """A new build of the image: its layers and one more (the user's code changed), removed from this machine after
    the test."""
    (tmp_path / "Dockerfile").write_text(f"FROM {IMAGE}\nCOPY note.txt /opt/horovod-stack/note.txt\n")
    (tmp_path / "note.txt").write_text(f"a new build {os.urandom(4).hex()}\n")
    engine = docker.from_env()
    image, _ = engine.images.build(path=str(tmp_path), tag=PUSHED_IMAGE, rm=True)
    yield image
    engine.images.remove(PUSHED_IMAGE, force=True)


PUSHED_IMAGE = "horovod-stack:new-build"


def test_in_the_docs_order_doctor_pushes_only_the_new_layers_then_every_check_runs_and_start_trains(
    bare, new_build, measured, tmp_path
):
    """docs/multi-host.md's order on nodes that lack the image (both hold an earlier build): `doctor` names the missing
    image and the flag that brings it; `doctor --push-image --links` sends both only the new build's new layer, in one
    export streamed to both loads at once, then every check and the link test run; `start` trains on it, no copy;
    `results` brings the run's folder home."""
    cluster = bare
    for node in cluster.nodes:
        cluster.ensure_image(IMAGE, node)
    checks = ["doctor", "--env-file", str(cluster.env_file()), "--image", PUSHED_IMAGE]
    lacking = launcher(cluster, *checks)
    assert lacking.returncode == 1, lacking.stdout + lacking.stderr
    assert (
        f"node_1: image         FAIL image {PUSHED_IMAGE} is not there; pass --push-image to copy it" in lacking.stdout
    )
    started = time.monotonic()
    result = launcher(cluster, *checks, "--push-image", "--links", "--link-seconds", "1", "--compute-ms", "50")
    measured(f"doctor with a push of a new build's layer took {time.monotonic() - started:.0f} s")
    assert result.returncode == 0, result.stderr[-5000:] + result.stdout[-3000:]
    assert result.stdout.splitlines()[-1] == "all nodes ready", result.stdout
    assert "node_2: ssh port      ok free (12345)" in result.stdout and "links: advice: " in result.stdout
    layer_count = len(new_build.attrs["RootFS"]["Layers"])
    assert (
        f"node_1, node_2: {layer_count - 1} of the {layer_count} layers of {PUSHED_IMAGE} there already (an earlier "
        "build's); pushing the others"
    ) in result.stderr, result.stderr
    assert re.search(rf"node_1, node_2: pushing {PUSHED_IMAGE}: (\S+) of \1 GB", result.stderr), result.stderr
    loaded = re.findall(r"(node_\d): image loaded, ([\d.]+) GB", result.stderr)
    assert [node for node, _ in sorted(loaded)] == ["node_1", "node_2"], result.stderr
    assert all(float(size) < 0.01 for _, size in loaded), loaded  # the new layer and the image's records
    assert all(node.client().images.get(PUSHED_IMAGE).id == new_build.id for node in cluster.nodes)
    # Both engines report the host name gpu-server (tests/multihost.py), and node_1 runs two ranks: Open MPI, which
    # tells nodes apart by host name, crashed at start here before each worker had a host name of its own.
    result = launcher(cluster, *start_args(cluster, "--image", PUSHED_IMAGE, "--nodes", "node_1:2,node_2:1"), *TRAIN)
    print(f"\n$ launcher start --nodes node_1:2,node_2:1 ...\n{result.stderr}{result.stdout}")
    assert result.returncode == 0, result.stderr[-5000:] + result.stdout[-3000:]
    assert "connecting to node_1 (ssh://node_1)" in result.stderr and "pushing" not in result.stderr
    assert "node_1: engine reachable at ssh://node_1" in result.stderr
    assert (
        f"node_1, node_2: share the host name {SHARED_HOST_NAME}: each worker gets its own (node-1, node-2), so "
        "Open MPI tells the nodes apart"
    ) in result.stderr
    assert "parameters identical on all 3 ranks" in result.stdout
    summary = json.loads(node_file(cluster, "node_1", "/shared/runs/summary.json"))
    assert summary["final"]["val_accuracy"] >= 0.90
    assert [rank["host"] for rank in summary["ranks"]] == ["node-1", "node-1", "node-2"]
    rank_addresses = [rank["addresses"] for rank in summary["ranks"]]
    assert cluster.nodes[0].address in rank_addresses[1] and cluster.nodes[1].address in rank_addresses[2]
    assert_nothing_left(cluster)
    cluster_id = re.search(r"results to this machine: launcher results --cluster (\w+) --to results", result.stderr)
    home = launcher(cluster, "results", "--env-file", str(cluster.env_file()), "--to", str(tmp_path))
    print(f"\n$ launcher results --to {tmp_path}\n{home.stderr}{home.stdout}")
    assert home.returncode == 0 and cluster_id, home.stderr + result.stderr[-3000:]
    assert (tmp_path / cluster_id.group(1) / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_warm_start_with_no_nic_pinned_trains_over_the_nodes_own_nic(cluster, measured):
    # Each node's engine made a docker0 of 172.17.0.1/16, the same on both: a rank that took it would "reach" its
    # own host and hang. Unpinned, the job leaves every virtual NIC out and runs over the nodes' one real NIC.
    started = time.monotonic()
    result = launcher(cluster, "start", "--env-file", str(cluster.env_file(pin_nic=False)), *TRAIN)
    assert result.returncode == 0, result.stderr[-3000:]
    for line in (
        "node_1: sshd answers on port 12345",
        "node_2: sshd answers on port 12345",
        f"image {IMAGE}",
        "is the same on all 2 nodes",
        "no NIC pinned: Open MPI and NCCL leave out lo*, docker*, br-*, veth*, virbr* (172.17.0.0/16",
        "--mca btl_tcp_if_exclude 127.0.0.1/8,172.17.0.0/16",
    ):
        assert line in result.stderr, result.stderr
    summary = json.loads(node_file(cluster, "node_1", "/shared/runs/summary.json"))
    assert summary["final"]["val_accuracy"] >= 0.90
    measured(f"warm launch, start to exit: {time.monotonic() - started:.0f} s")
    assert_nothing_left(cluster)


def test_users_script_from_workdir_runs_on_both_hosts_with_its_exit_status(cluster, measured):
    """The article's `mpirun ... python mnist_train.py`, as `launcher start --workdir DIR -- python SCRIPT`."""
    started = time.monotonic()
    result = launcher(
        cluster,
        *start_args(cluster, "--workdir", str(USER_SCRIPT), "--env", "USER_SETTING=on"),
        "--",
        "python",
        "allreduce_train.py",
        "--exit-status",
        "3",
    )
    measured(f"warm --workdir launch, start to exit: {time.monotonic() - started:.1f} s")
    assert result.returncode == 3, result.stderr[-3000:] + result.stdout[-3000:]
    assert "copied to /workdir on 2 node(s)" in result.stderr
    assert "-x USER_SETTING=on " in result.stderr
    assert "-wdir /workdir python allreduce_train.py --exit-status 3" in result.stderr
    for rank in (0, 1):
        assert f"user-script rank {rank} of 2 on " in result.stdout
        assert "(2 hosts, 1 rank(s) on this one): allreduce sum 3 ok" in result.stdout
    assert_nothing_left(cluster)


def test_the_pytorch_example_trains_on_both_hosts_as_the_readme_types_it(cluster, measured):
    """README.md's `launcher start --nodes node_1,node_2 --workdir ./examples -- python pytorch_digits.py`: the
    example learns the digits on both nodes and its ranks end with the same parameters (tests/test_examples.py)."""
    launch_example_as_typed(
        "pytorch_digits.py", lambda words: launcher(cluster, *start_args(cluster), *words[1:]), measured
    )
    assert_nothing_left(cluster)


def test_users_script_failing_on_rank_1_shows_its_traceback(cluster):
    result = launcher(
        cluster,
        *start_args(cluster, "--workdir", str(USER_SCRIPT)),
        "--",
        "python",
        "allreduce_train.py",
        "--fail-on-rank",
        "1",
    )
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "Traceback (most recent call last)" in output
    assert "RuntimeError: user script failed on purpose on rank 1" in output
    # the agent's cause, from rank 1's record (app/rank_error.py), which the job's output no longer shows
    cause = "rank 1 on node_2: RuntimeError: user script failed on purpose on rank 1"
    assert f"] error: {cause}" in result.stderr, result.stderr[-3000:]  # the agent's line
    assert rank_error.MARKER not in output
    assert result.stderr.splitlines()[-1] == f"error: {cause}", result.stderr[-2000:]  # the launch's last line
    assert_nothing_left(cluster)


def test_users_script_missing_on_the_nodes_is_named(cluster):
    result = launcher(cluster, *start_args(cluster), "--", "python", "train_missing.py")
    assert result.returncode == 1
    assert error_lines(result) == [
        "error: node_1: cannot start `python train_missing.py` in /home/mpiuser: script train_missing.py is not "
        "there; pass --workdir with the folder that holds your code, or build an image FROM horovod-stack:latest "
        "that has it"
    ]
    assert_nothing_left(cluster)


def test_unreachable_node_fails_before_starting_anything(cluster):
    env_file = cluster.env_file()
    # A plain tcp:// engine off this machine needs INSECURE_ENGINES (tests/test_engine_access.py): allowed here.
    env_file.write_text(env_file.read_text() + "DOCKER_HOST_NODE_7=tcp://10.213.7.99:2375\nINSECURE_ENGINES=1\n")
    result = launcher(cluster, "start", "--env-file", str(env_file), "--nodes", "node_1,node_2,node_7", *TRAIN)
    assert result.returncode == 1
    assert error_lines(result) == [
        "error: node_7: cannot reach its Docker engine at tcp://10.213.7.99:2375 "
        "(another address: DOCKER_HOST_NODE_7 in .env): no route to 10.213.7.99 (down, "
        "or on a network this machine cannot reach)"
    ]
    unknown = launcher(cluster, *start_args(cluster), "--nodes", "node_1,node_9", *TRAIN)
    assert unknown.returncode == 1
    [line] = error_lines(unknown)
    assert line.startswith(
        "error: node_9: cannot reach its Docker engine at ssh://node_9 (another address: "
        "DOCKER_HOST_NODE_9 in .env): node_9 does not resolve on this machine; add it to /etc/hosts"
    ), line
    assert_nothing_left(cluster)


def test_a_node_that_drops_every_packet_is_named_within_the_connect_timeout(cluster, measured):
    """node_1's namespace drops whatever reaches it (a host powered off, a firewall): doctor and start each give up
    on it after CONNECT_TIMEOUT with one line, instead of waiting on ssh for minutes."""
    env_file = cluster.env_file()
    env_file.write_text(env_file.read_text() + "CONNECT_TIMEOUT=3\n")
    expected = (
        "node_1: cannot reach its Docker engine at ssh://node_1 (another address: DOCKER_HOST_NODE_1 in .env): "
        "no answer from node_1 within 3 s (the host is down, or a firewall drops its ssh port)"
    )
    with cluster.silenced(cluster.nodes[0]):
        started = time.monotonic()
        doctor = launcher(cluster, "doctor", "--env-file", str(env_file), timeout=120)
        doctor_seconds = time.monotonic() - started
        start = launcher(cluster, "start", "--env-file", str(env_file), *TRAIN, timeout=120)
    measured(f"doctor against a silent node returned after {doctor_seconds:.1f} s")
    assert doctor.returncode == 1
    assert doctor.stdout.startswith("connecting to node_1 (ssh://node_1)\n"), doctor.stdout
    assert f"node_1: engine        FAIL {expected.removeprefix('node_1: ')}" in doctor.stdout, doctor.stdout
    assert "node_2: engine        ok" in doctor.stdout  # the other node is still checked
    assert start.returncode == 1
    [line] = error_lines(start)
    assert line.startswith(f"error: {expected}"), line
    assert_nothing_left(cluster)


def test_ssh_port_taken_on_a_node(cluster):
    listener = cluster.listen_on(cluster.nodes[1], 12345)
    try:
        result = launcher(cluster, *start_args(cluster), *TRAIN)
    finally:
        listener.terminate()
    assert result.returncode == 1
    assert error_lines(result) == [
        "error: node_2: port 12345 is already in use there; free it or pass --ssh-port with a free port"
    ]
    assert_nothing_left(cluster)


def worker_states(status: str) -> list[str]:
    """The state `launcher status` gives each node's worker (its lines after the cluster's and the image's)."""
    return [line.split()[-1] for line in status.splitlines() if " role=" in line]


def test_second_start_is_refused_while_one_runs_then_stop_removes_it(cluster):
    detached = launcher(cluster, *start_args(cluster, "--detach"), *LONG_TRAIN)
    assert detached.returncode == 0, detached.stderr[-3000:]
    second = launcher(cluster, *start_args(cluster), *TRAIN)
    assert second.returncode == 1
    [line] = error_lines(second)
    assert "is still running; stop it first with `launcher stop" in line
    status = launcher(cluster, "status", "--env-file", str(cluster.env_file()))
    assert "running: " in status.stdout.splitlines()[0], status.stdout
    assert worker_states(status.stdout) == ["running", "running"], status.stdout
    assert re.search(r"^  image \S+ \(PyTorch\)$", status.stdout, re.MULTILINE), status.stdout
    deadline = time.monotonic() + 120
    while "[rank 0] epoch 1 [" not in (logs := launcher(cluster, "logs", "--env-file", str(cluster.env_file()))).stdout:
        assert time.monotonic() < deadline, logs.stdout[-2000:] + logs.stderr[-2000:]
        time.sleep(2)
    stop = launcher(cluster, "stop", "--env-file", str(cluster.env_file()))
    assert stop.returncode == 0 and "node_1: removed 1 container(s)" in stop.stdout
    assert_nothing_left(cluster)


def wait_until_stopped(cluster: Cluster, timeout: float = 300) -> list:
    """Both nodes' containers of the stack, once none is running (a detached job winds down by itself)."""
    deadline = time.monotonic() + timeout
    while True:
        containers = [
            c
            for node in cluster.nodes
            for c in node.client().containers.list(all=True, filters={"label": "horovod-stack.cluster"})
        ]
        if containers and all(c.status == "exited" for c in containers):
            return containers
        assert time.monotonic() < deadline, [(c.name, c.status) for c in containers]
        time.sleep(1)


def seconds_between(earlier: str, later: str) -> float:
    parse = lambda stamp: datetime.fromisoformat(stamp[:19]).replace(tzinfo=UTC)  # noqa: E731
    return (parse(later) - parse(earlier)).total_seconds()


def test_detached_job_shows_its_latest_epoch_then_winds_down_by_itself_and_says_how_it_ended(cluster, measured):
    detached = launcher(
        cluster,
        *start_args(cluster, "--detach", "--device", "/dev/null:/dev/hst-test-device"),
        "--",
        "--dataset",
        "synthetic",
        "--epochs",
        "15",
    )
    assert detached.returncode == 0, detached.stderr[-3000:]
    assert "every container stops when the job ends" in detached.stderr
    deadline = time.monotonic() + 180
    while True:  # `status` while it runs
        status = launcher(cluster, "status", "--env-file", str(cluster.env_file()))
        first = status.stdout.splitlines()[0] if status.stdout else ""
        if "running: epoch " in first:
            break
        before = ("running: no epoch finished yet", f"running: {jobstate.NO_METRICS}")  # the trainer's file, or none
        assert any(line in first for line in before), status.stdout + status.stderr
        assert time.monotonic() < deadline, status.stdout
        time.sleep(1)
    print(f"\n{status.stdout}")
    assert re.search(r"running: epoch \d+( of 15)?, val accuracy [0-9.]+, \d+ samples/s$", first), first
    assert worker_states(status.stdout) == ["running", "running"], status.stdout
    containers = wait_until_stopped(cluster)  # the launcher process is long gone: nothing depends on it
    rank0 = next(c for c in containers if c.labels["horovod-stack.role"] == "rank0")
    _, log_stat = rank0.get_archive("/home/mpiuser/job.log")
    lags = [seconds_between(log_stat["mtime"], c.attrs["State"]["FinishedAt"]) for c in containers]
    measured(f"containers stopped {', '.join(f'{lag:.1f}' for lag in lags)} s after the job's last line")
    assert max(lags) <= 10 and [c.attrs["State"]["ExitCode"] for c in containers] == [0, 0]
    for container in containers:  # what NCCL asks of a container
        assert container.attrs["HostConfig"]["CapAdd"] == ["IPC_LOCK", "SYS_PTRACE"]  # SYS_PTRACE: py-spy
        assert {"Name": "stack", "Soft": 64 * 1024**2, "Hard": 64 * 1024**2} in container.attrs["HostConfig"]["Ulimits"]
        [device] = container.attrs["HostConfig"]["Devices"]  # --device, as RDMA's /dev/infiniband would be
        assert (device["PathOnHost"], device["PathInContainer"]) == ("/dev/null", "/dev/hst-test-device")

    status = launcher(cluster, "status", "--env-file", str(cluster.env_file()))
    print(status.stdout)
    assert "succeeded (exit status 0): epoch 15 of 15, val accuracy" in status.stdout
    assert status.stdout.count("exited (exit status 0)") == 2
    logs = launcher(cluster, "logs", "--env-file", str(cluster.env_file()))
    assert "epoch 1/15:" in logs.stdout and "parameters identical on all 2 ranks" in logs.stdout


def test_detached_job_whose_rank_raises_ends_as_failed_then_stop_removes_both(cluster):
    first = launcher(cluster, *start_args(cluster, "--detach"), "--", "--dataset", "synthetic", "--epochs", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    wait_until_stopped(cluster)
    detached = launcher(
        cluster,
        *start_args(cluster, "--detach", "--workdir", str(USER_SCRIPT)),
        "--",
        "python",
        "allreduce_train.py",
        "--fail-on-rank",
        "1",
    )
    assert detached.returncode == 0, detached.stderr[-3000:]
    assert "finished cluster" in detached.stderr  # the first job's, kept for status and logs, not refused
    wait_until_stopped(cluster)
    status = launcher(cluster, "status", "--env-file", str(cluster.env_file()))
    print(status.stdout)
    assert "failed (exit status 1): rank 1 on node_2: RuntimeError: user script failed on purpose on rank 1" in (
        status.stdout
    )
    assert "succeeded (exit status 0)" in status.stdout
    by_node = {
        node: launcher(cluster, "logs", "--env-file", str(cluster.env_file()), "--node", node).stdout
        for node in ("node_1", "node_2")
    }  # rank 0 ran on node_1, rank 1 on node_2
    assert "[1,1]<stderr>:RuntimeError: user script failed on purpose on rank 1" in by_node["node_2"], by_node
    assert "[1,1]<" not in by_node["node_1"] and "[1,0]<" not in by_node["node_2"], by_node
    # each worker's own last word: how the job ended, its cause included
    said = "the job ended (exit status 1: rank 1 on node_2: RuntimeError: user script failed on purpose on rank 1)"
    assert all(said in log for log in by_node.values()), by_node
    stop = launcher(cluster, "stop", "--env-file", str(cluster.env_file()))
    assert stop.returncode == 0 and "node_1: removed 2 container(s)" in stop.stdout
    assert_nothing_left(cluster)


def start_in_background(cluster: Cluster, train: list[str] = LONG_TRAIN) -> subprocess.Popen:
    process = subprocess.Popen(
        [LAUNCHER, *start_args(cluster), *train],
        env=cluster.launcher_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_signal_dispositions,
    )
    assert process.stdout is not None and process.stderr is not None
    deadline = time.monotonic() + 300
    epochs = train[train.index("--epochs") + 1]
    for line in process.stdout:  # rank 0's output: wait for training to be under way
        if f"epoch 1/{epochs}" in line:
            return process
        assert time.monotonic() < deadline
    raise AssertionError(f"training never started: {process.stderr.read()[-3000:]}")


def test_worker_killed_mid_run(cluster):
    process = start_in_background(cluster)
    victim = cluster.nodes[1].client().containers.list(filters={"label": "horovod-stack.node=node_2"})[0]
    victim.kill()
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 1
    [line] = [said for said in stderr.splitlines() if said.startswith("error: ")]
    assert line.startswith("error: node_2: its worker container ") and "during the run" in line
    assert_nothing_left(cluster)


def test_ctrl_c_during_training_removes_everything(cluster, measured):
    process = start_in_background(cluster)
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    measured(
        f"SIGINT to an attached launch: exit status {process.returncode} in {time.monotonic() - sent:.1f} s, "
        f"containers left {cluster.project_containers()}"
    )
    assert process.returncode == 130
    assert [said for said in stderr.splitlines() if said.startswith("error: ")] == [
        "error: interrupted; the cluster's containers were removed"
    ]
    assert_nothing_left(cluster)


@pytest.mark.parametrize(
    "signum, status, words",
    [
        (signal.SIGTERM, 143, "stopped (SIGTERM)"),
        (signal.SIGHUP, 129, "the terminal closed (SIGHUP)"),
    ],
)
def test_sigterm_or_sighup_during_training_removes_everything(cluster, signum, status, words, measured):
    """A service manager's or CI's SIGTERM, a closed terminal's SIGHUP: as Ctrl-C, the cluster goes on every node."""
    process = start_in_background(cluster)
    sent = time.monotonic()
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    took = time.monotonic() - sent
    left = cluster.project_containers()
    measured(
        f"{signal.Signals(signum).name} to an attached launch: exit status {process.returncode} in {took:.1f} s, "
        f"containers left {left}"
    )
    assert process.returncode == status and took <= 10, stderr[-3000:]
    assert error_lines(run_result(stderr)) == [f"error: {words}; the cluster's containers were removed"]
    assert_nothing_left(cluster)


def test_a_killed_launcher_leaves_the_job_to_the_cluster_which_ends_it(cluster, measured):
    """SIGKILL (a crash, a laptop that sleeps): the job runs to its end, then every container stops by itself."""
    process = start_in_background(cluster, ["--", "--dataset", "digits", "--epochs", "15"])
    process.kill()
    process.communicate(timeout=30)
    containers = wait_until_stopped(cluster, timeout=300)
    rank0 = next(c for c in containers if c.labels["horovod-stack.role"] == "rank0")
    _, log_stat = rank0.get_archive("/home/mpiuser/job.log")
    lags = [seconds_between(log_stat["mtime"], c.attrs["State"]["FinishedAt"]) for c in containers]
    status = launcher(cluster, "status", "--env-file", str(cluster.env_file()))
    measured(
        f"launcher SIGKILLed: containers stopped {', '.join(f'{lag:.1f}' for lag in lags)} s after the job's "
        f"last line; {status.stdout.splitlines()[0]}"
    )
    assert max(lags) <= 15 and [c.attrs["State"]["ExitCode"] for c in containers] == [0, 0]
    assert "succeeded (exit status 0): epoch 15 of 15" in status.stdout.splitlines()[0], status.stdout
    launcher(cluster, "stop", "--env-file", str(cluster.env_file()))
    assert_nothing_left(cluster)


def test_a_killed_rank0_container_stops_the_other_workers(cluster, measured):
    """rank 0's container killed (docker kill, out of memory, its host gone): node_2's worker stops by itself."""
    detached = launcher(cluster, *start_args(cluster, "--detach"), *LONG_TRAIN)
    assert detached.returncode == 0, detached.stderr[-3000:]
    deadline = time.monotonic() + 120
    while "[rank 0] epoch 1 [" not in (logs := launcher(cluster, "logs", "--env-file", str(cluster.env_file()))).stdout:
        assert time.monotonic() < deadline, logs.stdout[-2000:] + logs.stderr[-2000:]
        time.sleep(1)
    killed = kill_worker(cluster, "node_1")
    worker = cluster.nodes[1].client().containers.list(filters={"label": "horovod-stack.node=node_2"})[0]
    while worker.status == "running":
        assert time.monotonic() - killed < 60, "node_2's worker outlived rank 0's container by a minute"
        time.sleep(0.5)
        worker.reload()
    took = time.monotonic() - killed
    # The entrypoint's last word, among sshd's own lines about the closed sessions (it logs at INFO)
    last_line = next(line for line in reversed(worker.logs(tail=10).decode().splitlines()) if " worker] " in line)
    status = launcher(cluster, "status", "--env-file", str(cluster.env_file()))
    measured(
        f"rank 0's container killed: node_2's worker stopped {took:.1f} s later ({last_line}); "
        f"{status.stdout.splitlines()[0]}"
    )
    said = lost_driver_message("rank 0's container on node_1").removeprefix(LOST_PREFIX)  # as the entrypoint logs it
    assert f"{said}; stopping" in last_line
    assert "failed: rank 0's container stopped (exit status 137) before the job ended" in status.stdout
    launcher(cluster, "stop", "--env-file", str(cluster.env_file()))
    assert_nothing_left(cluster)


def test_doctor_checks_every_node(cluster):
    result = launcher(cluster, "doctor", "--env-file", str(cluster.env_file()))
    assert result.returncode == 0, result.stdout + result.stderr
    for node in ("node_1", "node_2"):
        assert f"{node}: engine        ok" in result.stdout and f"{node}: ssh port      ok free" in result.stdout
    assert "all nodes ready" in result.stdout

    subnet = cluster.nodes[0].address.rsplit(".", 1)[0] + ".0/24"
    by_subnet = launcher(cluster, "doctor", "--env-file", str(cluster.env_file()), "--network-interface", subnet)
    assert by_subnet.returncode == 0, by_subnet.stdout + by_subnet.stderr
    for node in cluster.nodes:
        assert f"{node.name}: network iface ok (hst0 {node.address}/24)" in by_subnet.stdout
    elsewhere = launcher(cluster, "doctor", "--env-file", str(cluster.env_file()), "--network-interface", "10.9.9.0/24")
    assert elsewhere.returncode == 1
    assert (
        f"node_2: network iface FAIL no address in 10.9.9.0/24 there (it has hst0 {cluster.nodes[1].address}/24, "
        "docker0 172.17.0.1/16)"
    ) in elsewhere.stdout


def node_file(cluster: Cluster, node_name: str, path: str) -> str:
    node = next(n for n in cluster.nodes if n.name == node_name)
    return (
        node.client()
        .containers.run(
            IMAGE, ["cat", path], volumes={"horovod-stack-shared": {"bind": "/shared", "mode": "ro"}}, remove=True
        )
        .decode()
    )


class BackgroundLaunch:
    """`launcher start ...` in the background, rank 0's output read as it comes (with when each line came)."""

    def __init__(self, cluster: Cluster, *args: str) -> None:
        self.process = subprocess.Popen(
            [LAUNCHER, *args],
            env=cluster.launcher_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_signal_dispositions,
        )
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line))

    def wait_for(self, text: str, timeout: float = 300) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = [when for when, line in self.lines if text in line]
            if seen:
                return seen[0]
            assert self.process.poll() is None or self.reader.is_alive(), self.stderr_tail()
            time.sleep(0.1)
        raise AssertionError(f"no {text!r} within {timeout} s: {self.stderr_tail()}")

    def finish(self, timeout: float = 600) -> tuple[int, str, str]:
        _, stderr = self.process.communicate(timeout=timeout)
        self.reader.join(timeout=10)
        return self.process.returncode, "".join(line for _, line in self.lines), stderr

    def stderr_tail(self) -> str:
        assert self.process.stderr is not None
        return "" if self.process.poll() is None else self.process.stderr.read()[-3000:]


def elastic_args(cluster: Cluster, metrics: str, *extra: str, epochs: int = 20) -> list[str]:
    return [
        *start_args(cluster, "--push-image", "--elastic", "--min-nodes", "1", *extra),
        "--",
        "--dataset",
        "synthetic",
        "--epochs",
        str(epochs),
        "--metrics-file",
        f"/shared/runs/{metrics}",
    ]


def kill_worker(cluster: Cluster, node_name: str) -> float:
    node = next(n for n in cluster.nodes if n.name == node_name)
    node.client().containers.list(filters={"label": f"horovod-stack.node={node_name}"})[0].kill()
    return time.monotonic()


def world_sizes(cluster: Cluster, metrics: str) -> list[int]:
    return [
        json.loads(line)["world_size"] for line in node_file(cluster, "node_1", f"/shared/runs/{metrics}").splitlines()
    ]


def crash_worker(cluster: Cluster, node_name: str) -> float:
    """The node's worker container fails as a crash or the kernel's out-of-memory kill would end it: its main process
    killed from the host. (`docker kill` is a stop by hand, which no restart policy undoes.)"""
    node = next(n for n in cluster.nodes if n.name == node_name)
    container = node.client().containers.list(filters={"label": f"horovod-stack.node={node_name}"})[0]
    os.kill(container.attrs["State"]["Pid"], signal.SIGKILL)
    return time.monotonic()


def logs_once_they_say(cluster: Cluster, text: str, timeout: float = 300) -> str:
    """`launcher logs` (the job's output and its agent's lines), polled until it holds `text`."""
    deadline = time.monotonic() + timeout
    while text not in (logs := launcher(cluster, "logs", "--env-file", str(cluster.env_file())).stdout):
        assert time.monotonic() < deadline, f"no {text!r} within {timeout} s:\n{logs[-3000:]}"
        time.sleep(2)
    return logs


def test_a_detached_elastic_job_takes_back_a_worker_its_node_started_again(cluster, measured):
    """--detach --restart-workers --worker-restarts 2: node_2's worker fails mid-run and node_2's engine starts it
    again (its restart policy); the agent claims it and it trains again (2 -> 1 -> 2), with no launcher running."""
    started = launcher(
        cluster,
        *elastic_args(cluster, "elastic-rejoin.jsonl", "--detach", "--restart-workers", "--worker-restarts", "2"),
    )
    assert started.returncode == 0, started.stderr[-3000:]
    assert "a failed worker started again 2 time(s) at most" in started.stderr, started.stderr
    logs_once_they_say(cluster, "epoch 2/20:")
    crashed = crash_worker(cluster, "node_2")
    logs_once_they_say(cluster, "world size 2 -> 1", timeout=120)
    logs = logs_once_they_say(cluster, "world size 1 -> 2")
    measured(f"elastic, detached: node_2 back in training at most {time.monotonic() - crashed:.1f} s after it failed")
    assert "node_2: worker lost during the run; host discovery drops it" in logs, logs[-3000:]
    assert (
        "node_2: a new worker there is claimed; host discovery lists it again (its engine's restart 1 of at most 2, "
        "--worker-restarts)"
    ) in logs, logs[-3000:]

    containers = {c.labels["horovod-stack.node"]: c for c in wait_until_stopped(cluster)}
    assert containers["node_2"].attrs["RestartCount"] == 1  # once: its end after the job's is not a failure
    assert containers["node_2"].attrs["HostConfig"]["RestartPolicy"] == {"Name": "on-failure", "MaximumRetryCount": 2}
    assert containers["node_1"].attrs["HostConfig"]["RestartPolicy"]["Name"] in ("", "no")  # the elastic driver's
    status = launcher(cluster, "status", "--env-file", str(cluster.env_file())).stdout
    assert "succeeded (exit status 0): epoch 20 of 20" in status, status
    sizes = world_sizes(cluster, "elastic-rejoin.jsonl")
    changes = [size for i, size in enumerate(sizes) if i == 0 or size != sizes[i - 1]]
    assert changes == [2, 1, 2], sizes


def test_elastic_job_below_its_minimum_fails_naming_the_lost_node(cluster):
    env_file = cluster.root / "elastic.env"
    env_file.write_text(cluster.env_file().read_text() + "ELASTIC_TIMEOUT=10\n")
    args = [
        "start",
        "--env-file",
        str(env_file),
        "--push-image",
        "--elastic",
        "--min-nodes",
        "2",
        "--",
        "--dataset",
        "synthetic",
        "--epochs",
        "200",
    ]
    run = BackgroundLaunch(cluster, *args)
    run.wait_for("epoch 1/200:")
    kill_worker(cluster, "node_2")
    status, _, stderr = run.finish(timeout=300)
    assert status == 1
    assert error_lines(run_result(stderr)) == [
        "error: the elastic job fell below --min-nodes 2 for 10 s: lost node_2 (its worker container stopped (killed))"
    ], stderr[-3000:]
    assert_nothing_left(cluster)


SILENT_NODE_2 = "node_2 went silent (no answer for 15 s: link down, host down or powered off)"


def test_a_node_that_goes_silent_ends_a_fixed_job_within_a_minute(cluster, measured):
    """node_2's link set down mid-run (a pulled cable, a powered-off host: no TCP reset): the job ends, naming it."""
    run = BackgroundLaunch(cluster, *start_args(cluster, "--push-image"), *LONG_TRAIN)
    run.wait_for("epoch 1/200:")
    with cluster.link_down(cluster.nodes[1]) as cut:
        status, _, stderr = run.finish(timeout=180)
        took = time.monotonic() - cut
    measured(
        f"node_2's link down: the launcher exited {took:.1f} s later with status {status}: "
        f"{error_lines(run_result(stderr))}"
    )
    assert status == 1 and error_lines(run_result(stderr)) == [f"error: {SILENT_NODE_2}"], stderr[-3000:]
    assert took <= 60
    assert f"error: {SILENT_NODE_2}; ending the job" in stderr
    assert_nothing_left(cluster)


def test_elastic_job_goes_on_without_a_node_that_went_silent(cluster, measured):
    """--elastic --min-nodes 1: node_2's link set down mid-run; training goes on with node_1 and finishes."""
    run = BackgroundLaunch(cluster, *elastic_args(cluster, "elastic-silent.jsonl", epochs=30))
    run.wait_for("epoch 2/30:")
    with cluster.link_down(cluster.nodes[1]) as cut:
        went_on = run.wait_for("first step at world size 1", timeout=180) - cut
        # Horovod may go on without node_2 before the launcher's silence threshold has passed (17.6 s once, against
        # 15 s): the link stays down past it, so node_2 is silent, not back, when the launcher looks.
        time.sleep(max(0.0, cut + SILENCE_SECONDS + 10 - time.monotonic()))
    status, output, stderr = run.finish()
    measured(
        f"elastic, node_2's link down: first step at world size 1 {went_on:.1f} s after the cut, exit status {status}"
    )
    assert status == 0, stderr[-3000:] + output[-3000:]
    assert f"{SILENT_NODE_2}; host discovery drops it and the elastic job goes on without it" in stderr
    sizes = world_sizes(cluster, "elastic-silent.jsonl")
    assert len(sizes) == 30 and sizes[0] == 2 and sizes[-1] == 1 and sizes == sorted(sizes, reverse=True), sizes
    assert_nothing_left(cluster)


def run_result(stderr: str) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess([], 1, "", stderr)


# --- checks before start, and status while a job runs (appended: they need the image on both nodes, as the tests
# above leave them, and leave no container behind) ---


def test_missing_nic_is_refused_before_any_container_starts(cluster):
    result = launcher(cluster, *start_args(cluster, "--network-interface", "nosuchnic0"), *TRAIN)
    assert result.returncode == 1, result.stderr[-3000:]
    assert error_lines(result) == [
        "error: node_1: no network interface nosuchnic0 there (it has docker0, hst0, lo); pass "
        "--network-interface with one of them, or set NODE_NETWORK_INTERFACE in .env"
    ]
    assert "worker horovod-stack-" not in result.stderr  # refused before any worker started
    assert_nothing_left(cluster)


def test_doctor_checks_the_nic_on_every_node(cluster):
    result = launcher(cluster, "doctor", "--env-file", str(cluster.env_file()))  # hst0, from the env file
    assert result.returncode == 0, result.stdout + result.stderr
    for node in ("node_1", "node_2"):
        assert f"{node}: network iface ok (hst0)" in result.stdout
    missing = launcher(cluster, "doctor", "--env-file", str(cluster.env_file()), "--network-interface", "eth0")
    assert missing.returncode == 1
    assert "node_2: network iface FAIL no network interface eth0 there (it has docker0, hst0, lo)" in missing.stdout
    assert error_lines(missing)[0].startswith("error: 2 problem(s): node_1: no network interface eth0 there")
    assert_nothing_left(cluster)


def test_doctor_links_prints_the_matrix_and_the_prediction_on_the_slowest_link(cluster):
    result = launcher(cluster, "doctor", "--env-file", str(cluster.env_file()), "--links", "--link-seconds", "1")
    print(f"\n$ launcher doctor --env-file launcher.env --links --link-seconds 1\n{result.stdout}")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert (
        "links: host-network containers, over hst0, TCP port 12345, 1 s each way; from the row's node to the "
        "column's" in lines
    )
    unit = next(
        line for line in lines if line.split()[:3] in (["Mbit/s", "node_1", "node_2"], ["Gbit/s", "node_1", "node_2"])
    )
    rates = [float(lines[lines.index(unit) + 1].split()[2]), float(lines[lines.index(unit) + 2].split()[1])]
    assert all(rate > 0 for rate in rates), rates
    assert any(line.split()[:3] == ["RTT", "ms", "node_1"] for line in lines)
    assert "links: gradient: 0.03396 MB (the bundled trainer's SimpleNet, 8490 floats); N = 2 ranks" in lines
    assert any(line.startswith("links: slowest link: node_") for line in lines)
    assert any(line.startswith("links: predicted ring allreduce: ") for line in lines)
    assert (
        f"links: {cluster.nodes[0].name} <-> {cluster.nodes[1].name} ({cluster.nodes[1].address}:12345, 1 s each "
        "way)" in result.stderr
    )
    advice = next(line for line in lines if line.startswith("links: advice: "))
    assert "per step (the bundled trainer's, measured on node_1) on the slowest link: compute-bound" in advice, advice
    assert "all nodes ready" in lines
    assert_nothing_left(cluster)

    # A slow LAN: every node's link shaped to 10 Mbit/s each way; the trainer's 34 KB gradient now outweighs its
    # compute.
    with cluster.shaped(10):
        shaped = launcher(cluster, "doctor", "--env-file", str(cluster.env_file()), "--links", "--link-seconds", "1")
    print(
        f"\n$ launcher doctor --env-file launcher.env --links --link-seconds 1   # links shaped to 10 Mbit/s\n"
        f"{shaped.stdout}"
    )
    assert shaped.returncode == 0, shaped.stdout + shaped.stderr
    advice = next(line for line in shaped.stdout.splitlines() if line.startswith("links: advice: "))
    assert (
        ": communication-bound; fp16 compression halves the exchange (--fp16-allreduce / hvd.Compression.fp16)"
        in advice
    ), advice
    assert_nothing_left(cluster)

    by_subnet = launcher(
        cluster,
        "doctor",
        "--env-file",
        str(cluster.env_file()),
        "--links",
        "--link-seconds",
        "0.5",
        "--network-interface",
        cluster.nodes[0].address.rsplit(".", 1)[0] + ".0/24",
        "--gradient-mb",
        "100",
    )
    assert by_subnet.returncode == 0, by_subnet.stdout + by_subnet.stderr
    assert "links: gradient: 100 MB (--gradient-mb); N = 2 ranks" in by_subnet.stdout
    assert "links: advice: pass --compute-ms (your model's compute per step" in by_subnet.stdout
    assert_nothing_left(cluster)


def test_doctor_links_names_a_pair_that_cannot_reach_each_other_and_leaves_nothing(cluster):
    node_2 = cluster.nodes[1]
    firewall = ["INPUT", "-i", "hst0", "-p", "tcp", "--dport", "12345", "-j", "DROP"]  # as a host firewall would
    subprocess.run(node_2.in_namespace("iptables", "-I", *firewall), check=True)
    try:
        result = launcher(cluster, "doctor", "--env-file", str(cluster.env_file()), "--links", "--link-seconds", "1")
    finally:
        subprocess.run(node_2.in_namespace("iptables", "-D", *firewall), check=True)
    why = (
        f"node_1 cannot reach node_2 at {node_2.address}:12345 (timed out); allow TCP from node_1 to node_2 on the "
        "job's NIC (the workers' sshd port and the ports Open MPI, NCCL and Gloo open), or pin a NIC both reach "
        "with --network-interface"
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"links: FAIL {why}" in result.stdout.splitlines()
    assert error_lines(result) == [f"error: 1 problem(s): {why}"]
    assert "predicted" not in result.stdout
    assert_nothing_left(cluster)


def test_ctrl_c_during_doctor_links_removes_its_containers(cluster):
    process = subprocess.Popen(
        [LAUNCHER, "doctor", "--env-file", str(cluster.env_file()), "--links", "--link-seconds", "60"],
        env=cluster.launcher_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_signal_dispositions,
    )
    deadline = time.monotonic() + 120
    while not all(cluster.project_containers()[node.name] for node in cluster.nodes):  # node_2's server, node_1's probe
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert error_lines(subprocess.CompletedProcess([], 130, "", stderr)) == [
        "error: interrupted; the link-test containers were removed"
    ]
    assert_nothing_left(cluster)


def ranks_per_host(output: str) -> list[str]:
    return sorted(re.findall(r"user-script rank \d+ of 3 on \S+ \(\d hosts, (\d) rank\(s\) on this one\)", output))


def test_per_node_rank_counts_put_two_ranks_on_node_1_and_one_on_node_2(cluster):
    """--nodes node_1:2,node_2:1 (a --hostfile of the same counts makes the same plan: tests/test_launcher_plan.py)."""
    nodes = ["--nodes", "node_1:2,node_2:1"]
    env_file = cluster.root / "no-nodes.env"
    env_file.write_text(
        "\n".join(line for line in cluster.env_file().read_text().splitlines() if not line.startswith("NODES=")) + "\n"
    )
    result = launcher(
        cluster,
        "start",
        "--env-file",
        str(env_file),
        *nodes,
        "--workdir",
        str(USER_SCRIPT),
        "--",
        "python",
        "allreduce_train.py",
    )
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    assert "3 ranks on 2 node(s) [node_1: 2 rank(s) (ssh://node_1), node_2: 1 rank(s)" in result.stderr
    assert f"hostfile: {cluster.nodes[0].address}:2 {cluster.nodes[1].address}:1" in result.stderr
    # local size per rank: the two ranks on node_1 see 2 there, node_2's one rank sees 1.
    assert ranks_per_host(result.stdout) == ["1", "2", "2"], result.stdout[-3000:]
    assert "allreduce sum 6 ok" in result.stdout
    assert_nothing_left(cluster)


def test_nics_named_differently_train_fixed_and_elastic_jobs_over_the_subnet(cluster):
    subnet = cluster.nodes[0].address.rsplit(".", 1)[0] + ".0/24"
    with cluster.nic_renamed(cluster.nodes[1], "enp9s0"):
        by_name = launcher(cluster, *start_args(cluster), *TRAIN)  # NODE_NETWORK_INTERFACE=hst0: not on node_2
        assert by_name.returncode == 1
        assert error_lines(by_name) == [
            "error: node_2: no network interface hst0 there (it has docker0, enp9s0, lo); pass --network-interface "
            "with one of them, or set NODE_NETWORK_INTERFACE in .env"
        ]

        fixed = launcher(cluster, *start_args(cluster, "--network-interface", subnet), *TRAIN)
        assert fixed.returncode == 0, fixed.stderr[-3000:] + fixed.stdout[-3000:]
        for line in (
            f"node_1: port 12345 free, NIC hst0 in {subnet}",
            f"node_2: port 12345 free, NIC enp9s0 in {subnet}",
            f"--mca btl_tcp_if_include {subnet}",
            f"python -m launcher.agent.rank_nic {subnet} -- python -m app.train",
        ):
            assert line in fixed.stderr
        assert "parameters identical on all 2 ranks" in fixed.stdout

        elastic = launcher(
            cluster,
            *start_args(cluster, "--network-interface", subnet, "--elastic"),
            "--",
            "--dataset",
            "synthetic",
            "--epochs",
            "3",
            "--metrics-file",
            "/shared/runs/subnet.jsonl",
        )
        assert elastic.returncode == 0, elastic.stderr[-3000:] + elastic.stdout[-3000:]
        assert "--network-interface hst0 " in elastic.stderr  # horovodrun serves on rank 0's own NIC
        assert world_sizes(cluster, "subnet.jsonl") == [2, 2, 2]
    assert_nothing_left(cluster)


def test_dry_run_prints_the_plan_and_starts_nothing(cluster):
    result = launcher(cluster, *start_args(cluster, "--dry-run", "--nodes", "node_1:2,node_2"), *TRAIN)
    print(f"\n$ launcher start --dry-run --nodes node_1:2,node_2 ...\n{result.stdout}")
    assert result.returncode == 0, result.stderr[-3000:]
    for expected in (
        "plan: 3 ranks on 2 node(s)",
        "node_1 (rank 0, runs the job agent; engine ssh://node_1)",
        f"image {IMAGE} (",
        "network host, shared memory 1g",
        "environment SSH_PORT, WORKER_ADDRESS",
        f"hostfile /home/mpiuser/hostfile:\n  {cluster.nodes[0].address} slots=2\n  "
        f"{cluster.nodes[1].address} slots=1\n",
        "mpirun: mpirun -np 3 --hostfile",
    ):
        assert expected in result.stdout, result.stdout
    assert "PRIVATE KEY" not in result.stdout + result.stderr
    assert "dry run: nothing was started" in result.stderr
    assert_nothing_left(cluster)

    refused = launcher(cluster, *start_args(cluster, "--dry-run", "--network-interface", "10.9.9.0/24"), *TRAIN)
    assert refused.returncode == 1
    assert error_lines(refused)[0].startswith("error: node_1: no address in 10.9.9.0/24 there (it has hst0 ")
    assert_nothing_left(cluster)


def test_a_hung_job_says_where_it_hangs_and_a_stall_is_noticed_by_itself(cluster):
    """Rank 1 (node_2) blocks in a function of its own; rank 0 (node_1) waits for it in an allreduce. (--stall-action
    fail, the same agent's watch ending the job with that root cause, is tests/test_compose.py's
    test_a_stalled_job_shows_every_ranks_stack_and_fails_when_asked, and its error line tests/test_stall.py's.)"""
    stall_args = ["--workdir", str(USER_SCRIPT), "--stall-timeout", "20", "--env", "HOROVOD_STALL_CHECK_TIME_SECONDS=5"]
    # The job's time limit ends it by itself once the stall has been seen (then `status` says so; nothing runs on).
    # Alone, the stall is said about 25 s after the script starts; at 50 s and then 90 s the limit came first in full
    # runs, with this machine's other group pushing 6.7 GB.
    limit = 150
    started = launcher(
        cluster, *start_args(cluster, "--detach", "--time-limit", str(limit), *stall_args), "--", "python", "stall.py"
    )
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        deadline = time.monotonic() + 120
        while (
            "stall-script rank 0 of 2 started"
            not in launcher(cluster, "logs", "--env-file", str(cluster.env_file())).stdout
        ):
            assert time.monotonic() < deadline, "the stall script did not start"
            time.sleep(2)
        deadline = time.monotonic() + 60  # until rank 1 waits where the script stalls it
        waiting = re.compile(r"^rank 1 \(node_2 pid \d+\) in wait_for_data at stall.py:\d+", re.M)
        while not waiting.search((stacks := launcher(cluster, "stacks", "--env-file", str(cluster.env_file()))).stdout):
            assert time.monotonic() < deadline, stacks.stdout + stacks.stderr
            time.sleep(1)
        print(f"\n$ launcher stacks\n{stacks.stdout}")
        assert stacks.returncode == 0, stacks.stderr
        assert re.search(
            r"^rank 0 \(node_1 pid \d+\) in \w+ at mpi_ops.py:\d+, from main at stall.py:\d+", stacks.stdout, re.M
        ), stacks.stdout

        # Until the stall watch says so (20 s without output, then its next round), with where the ranks wait (once
        # their stacks are in) and Horovod's own warning; the job must still be running.
        said_stalled = re.compile(
            r"stalled for \d+ s: rank 1 \(node_2 pid \d+\) in wait_for_data at stall.py:\d+ while rank 0 .*; "
            r"Horovod: rank 1 missing from allreduce.after_the_wait"
        )
        while not said_stalled.search(
            status := launcher(cluster, "status", "--env-file", str(cluster.env_file())).stdout
        ):
            if ": running: " not in status.split("\n", 1)[0]:
                agent = launcher(cluster, "logs", "--env-file", str(cluster.env_file())).stdout
                said = "".join(line for line in agent.splitlines(True) if line.startswith(("[agent", "[1,")))
                raise AssertionError(f"the job ended before its stall was said:\n{status}\n{said[-6000:]}")
            time.sleep(2)
        print(f"\n$ launcher status\n{status}")
        logs = launcher(cluster, "logs", "--env-file", str(cluster.env_file())).stdout
        assert "the job looks stalled: no output and no new metrics for" in logs and "wait_for_data (" in logs
        deadline = time.monotonic() + limit  # until the job has failed and every container has stopped by itself
        while "failed" not in (status := launcher(cluster, "status", "--env-file", str(cluster.env_file())).stdout) or (
            " running" in status.split("\n", 1)[1]
        ):
            assert time.monotonic() < deadline, status
            time.sleep(3)
        print(f"\n$ launcher status  # after --time-limit {limit}\n{status}")
        assert (
            f"failed (exit status 124): the job ran past its time limit of {limit} s; rank 1 (node_2 pid" in status
        ), status
    finally:  # a failed assertion too: the next test starts on clean nodes
        launcher(cluster, "stop", "--env-file", str(cluster.env_file()))
    assert_nothing_left(cluster)


def test_a_mounted_folder_reaches_every_rank_and_a_missing_one_is_refused_first(cluster):
    dataset = cluster.root / "dataset"
    dataset.mkdir(exist_ok=True)
    (dataset / "greeting.txt").write_text("hello from the node's disk\n")
    result = launcher(
        cluster, *start_args(cluster, "--mount", f"{dataset}:/data:ro"), "--", "cat", "/data/greeting.txt"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("hello from the node's disk") == 2  # one rank on each node
    missing = launcher(cluster, *start_args(cluster, "--mount", f"{cluster.root}/no-such-folder:/data"), *TRAIN)
    assert missing.returncode == 1
    assert error_lines(missing)[0].startswith("error: node_1: a --mount folder is not there ("), missing.stderr
    assert "make it, or mount the same share at that path on every node" in error_lines(missing)[0]
    assert_nothing_left(cluster)


def test_a_shared_folder_lets_a_job_resume_with_rank_0_on_the_other_node(cluster):
    shared = cluster.root / "nfs"  # both test hosts see this host folder, as every node sees one NFS mount
    shared.mkdir(exist_ok=True)
    os.chown(shared, 1000, 1000)
    env_file = cluster.root / "shared.env"
    env_file.write_text(cluster.env_file().read_text() + f"SHARED_DIR={shared}\n")
    checkpoints = ["--dataset", "synthetic", "--checkpoint-dir", "/shared/checkpoints"]
    run = BackgroundLaunch(cluster, "start", "--env-file", str(env_file), "--", *checkpoints, "--epochs", "200")
    run.wait_for("epoch 2/200:")
    launcher(cluster, "stop", "--env-file", str(env_file))  # the first job ends early, rank 0 on node_1
    run.finish()
    reached = max(int(epoch) for _, line in run.lines for epoch in re.findall(r"epoch (\d+)/200:", line))
    epochs = str(reached + 5)  # a few more than the first job can have saved before it was stopped
    resumed = launcher(
        cluster,
        "start",
        "--env-file",
        str(env_file),
        "--nodes",
        "node_2,node_1",
        "--",
        *checkpoints,
        "--epochs",
        epochs,
        "--resume",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:] + resumed.stdout[-3000:]
    resuming = re.search(r"resuming from \S+ after epoch (\d+)", resumed.stdout + resumed.stderr)
    assert resuming, resumed.stderr[-3000:] + resumed.stdout[-3000:]
    started_at = int(resuming.group(1))
    assert started_at >= 2
    assert f"epoch {started_at + 1}/{epochs}:" in resumed.stdout and f"epoch 1/{epochs}:" not in resumed.stdout
    assert_nothing_left(cluster)


AUTOTUNE_QUICKLY = [
    "--env",
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES=1",
    "--env",
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE=2",
    "--env",
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=3",
]
"""Horovod's tuning in a few samples of a few steps, so a 2-epoch run scores some."""


def test_results_come_home_after_the_cluster_is_gone(cluster, tmp_path):
    """With --timeline and --autotune: rank 0's timeline and the autotuner's choice come home with the run."""
    result = launcher(
        cluster,
        *start_args(cluster, "--timeline", "--autotune", *AUTOTUNE_QUICKLY),
        "--",
        "--dataset",
        "digits",
        "--epochs",
        "2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stdout + result.stderr
    assert re.search(
        r"timeline: /shared/runs/\w+/timeline.json: \d+ tensors, allreduced over \d+ steps; per step", said
    )
    assert re.search(r"autotune: (chose|not finished after \d+ samples)", said), said[-3000:]
    hint = re.search(r"launcher results --cluster (\w+) --to results", result.stderr)
    assert hint, result.stderr[-3000:]
    cluster_id = hint.group(1)
    assert_nothing_left(cluster)
    home = launcher(cluster, "results", "--env-file", str(cluster.env_file()), "--to", str(tmp_path))
    assert home.returncode == 0, home.stderr
    print(f"\n$ launcher results --to {tmp_path}\n{home.stderr}{home.stdout}")
    run = tmp_path / cluster_id
    assert json.loads((run / "summary.json").read_text())["final"]["val_accuracy"] > 0
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    assert events.Tags()["scalars"], events.Tags()
    from app import timeline

    trace = json.loads((run / "timeline.json").read_text())  # valid JSON, as Perfetto and chrome://tracing read it
    summary = timeline.summarize(trace)
    print(f"\ntimeline of a 2-epoch digits run: {summary.line()}")
    assert summary.ranks == [0, 1] and summary.steps >= 2 and summary.collectives  # every rank's allreduces
    record = json.loads((run / "autotune.json").read_text())
    print(f"autotune.json: {record}")
    assert record["samples"] >= 1 and record["chosen"]["fusion_threshold_mb"] >= 0
    assert (run / "autotune.csv").read_text().startswith("hierarchical_allreduce,")
    unknown = launcher(cluster, "results", "--env-file", str(cluster.env_file()), "--cluster", "00000000")
    assert unknown.returncode == 1
    assert error_lines(unknown)[0].startswith(
        f"error: no run 00000000 in the shared folder of these nodes; the runs there: {cluster_id} (node_1)"
    )


@pytest.mark.parametrize("kind", ["fixed-size", "elastic"])
def test_a_secret_setting_reaches_every_rank_and_is_found_nowhere_else(cluster, tmp_path, kind):
    """--secret API_KEY, with mpirun and with elastic horovodrun: each rank has the value (its digest is right); no
    argv seen by ps in any container, log, status, dry run, job.json, file left in a container, `docker inspect` or
    exported MPIJob holds it. (And with the NIC pinned, each worker's sshd listens on the NIC's address alone.)"""
    value = f"sk-SECRET-{os.urandom(8).hex()}"
    env = {**cluster.launcher_env(), "API_KEY": value}
    elastic = ["--elastic", "--min-nodes", "2"] if kind == "elastic" else []
    job = [
        *start_args(cluster, "--workdir", str(USER_SCRIPT), "--secret", "API_KEY", *elastic),
        "--",
        "python",
        "secret_digest.py",
        "API_KEY",
    ]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [LAUNCHER, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            preexec_fn=default_signal_dispositions,
        )

    seen = {"dry run": run(*job[:1], "--dry-run", *job[1:])}
    assert "secrets API_KEY=***" in seen["dry run"].stdout, seen["dry run"].stderr[-3000:]
    started = run(job[0], "--detach", "--push-image", *job[1:])
    assert started.returncode == 0, started.stderr[-3000:]
    seen["start"] = started
    deadline = time.monotonic() + 180
    while (logs := run("logs", "--env-file", str(cluster.env_file()))).stdout.count("sha256") < 2:
        assert time.monotonic() < deadline, logs.stdout[-3000:] + logs.stderr[-3000:]
        time.sleep(1)
    processes = {
        node.name: [
            c.exec_run(["ps", "-eww", "-o", "args"]).output.decode()
            for c in node.client().containers.list(filters={"label": "horovod-stack.cluster"})
        ]
        for node in cluster.nodes
    }
    listening = {
        node.name: [
            c.exec_run(["ss", "-Hltn", "sport = :12345"]).output.decode().split()[3::5]
            for c in node.client().containers.list(filters={"label": "horovod-stack.cluster"})
        ]
        for node in cluster.nodes
    }
    wait_until_stopped(cluster)
    seen["logs"] = run("logs", "--env-file", str(cluster.env_file()))
    seen["status"] = run("status", "--env-file", str(cluster.env_file()))
    expected = hashlib.sha256(value.encode()).hexdigest()
    assert [line.split()[-1] for line in seen["logs"].stdout.splitlines() if "sha256" in line] == [expected] * 2
    assert "succeeded (exit status 0)" in seen["status"].stdout, seen["status"].stdout
    leaks = [
        f"{what}: {part}"
        for what, result in seen.items()
        for part in ("stdout", "stderr")
        if value in getattr(result, part)
    ]
    leaks += [f"ps on {node}" for node, listings in processes.items() for listing in listings if value in listing]
    assert all(listings for listings in processes.values()) and "secret_digest.py" in processes["node_2"][0]
    for node in cluster.nodes:
        for container in node.client().containers.list(all=True, filters={"label": "horovod-stack.cluster"}):
            leaks += [f"docker inspect {container.name}"] if value in json.dumps(container.attrs) else []
            leaks += [f"docker logs {container.name}"] if value.encode() in container.logs() else []
            for change in container.diff() or []:
                if change["Kind"] == 2:  # deleted
                    continue
                stream, info = container.get_archive(change["Path"])
                if not info["mode"] & (1 << 31) and value.encode() in b"".join(stream):  # Go's ModeDir: a folder
                    leaks.append(f"{change['Path']} in {container.name}")
    mpijob = run(
        "export",
        "mpijob",
        "--name",
        "digits",
        "--workers",
        "2",
        "--secret",
        "API_KEY=tracker/api-key",
        "--image",
        "registry.example.com/horovod-stack:1",
    )
    assert mpijob.returncode == 0 and "secretKeyRef" in mpijob.stdout and value not in mpijob.stdout
    print(
        f"\n--secret: every rank's digest {expected[:12]}... is the value's; places searched: {sorted(seen)}, ps in "
        f"{sum(map(len, processes.values()))} containers, every changed file and `docker inspect` of each; leaks: "
        f"{leaks}"
    )
    assert leaks == []
    print(f"sshd listens on: {listening}")
    assert all(
        addresses == [[f"{node.address}:12345"]] for node in cluster.nodes for addresses in [listening[node.name]]
    ), listening
    run("stop", "--env-file", str(cluster.env_file()))
    assert_nothing_left(cluster)


def test_a_fixed_job_that_loses_a_node_is_restarted_on_the_other_from_its_checkpoint(cluster, measured):
    """--max-restarts 1 --min-nodes 1: node_2's worker killed mid-run; the job's agent starts the job again on node_1
    alone, the trainer resuming after its last checkpointed epoch, and the job ends with exit status 0."""
    folder = f"/shared/runs/restart-{int(time.time())}"
    run = BackgroundLaunch(
        cluster,
        *start_args(cluster, "--push-image", "--max-restarts", "1", "--min-nodes", "1"),
        "--",
        "--dataset",
        "synthetic",
        "--epochs",
        "12",
        "--checkpoint-dir",
        f"{folder}/ck",
        "--metrics-file",
        f"{folder}/metrics.jsonl",
    )
    run.wait_for("epoch 2/12:")
    killed = kill_worker(cluster, "node_2")
    resumed = run.wait_for("resuming from", timeout=180)
    status, output, stderr = run.finish()
    measured(f"node_2's worker killed: the restarted job resumed {resumed - killed:.1f} s later, exit status {status}")
    assert status == 0, stderr[-3000:] + output[-3000:]
    [line] = [line for line in stderr.splitlines() if "restart 1/1: " in line]
    assert line.endswith(" on node_1") and "restart 1/1: node_2's worker was lost; resuming after epoch " in line
    records = [json.loads(line) for line in node_file(cluster, "node_1", f"{folder}/metrics.jsonl").splitlines()]
    assert [record["epoch"] for record in records] == list(range(1, 13))
    assert records[0]["world_size"] == 2 and records[-1]["world_size"] == 1
    assert records[-1]["val_accuracy"] >= 0.9
    assert_nothing_left(cluster)


def first_step_after(run: BackgroundLaunch, since: float, timeout: float = 180) -> float:
    """When rank 0 logged its first training step (`epoch N [k/M batches]`) after `since`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = [when for when, line in run.lines if when > since and re.search(r"epoch \d+ \[\d+/\d+ batches\]", line)]
        if steps:
            return steps[0]
        time.sleep(0.1)
    raise AssertionError(f"no training step within {timeout} s after the restart: {run.stderr_tail()}")


@pytest.mark.parametrize("loss", ["worker killed", "link down"])
def test_a_fixed_job_that_loses_a_node_goes_on_on_a_warm_spare_from_its_checkpoint(cluster, spare, loss, measured):
    """SPARES=node_3 and MAX_RESTARTS=1 in .env: node_2 lost mid-run (its worker killed; or its link down, silence
    with no TCP reset); the job's agent starts the job again on node_1 and the spare, whose worker was started and
    checked up front, the trainer resuming after its last checkpointed epoch at the same world size; the job ends
    with exit status 0, and the time from the loss to the first training step after it is printed."""
    env_file = cluster.root / "spare.env"
    env_file.write_text(cluster.env_file().read_text() + f"SPARES={spare.name}\nMAX_RESTARTS=1\n")
    folder = f"/shared/runs/spare-{loss.split()[0]}-{int(time.time())}"
    run = BackgroundLaunch(
        cluster,
        "start",
        "--env-file",
        str(env_file),
        "--",
        "--dataset",
        "synthetic",
        "--epochs",
        "20",
        "--checkpoint-dir",
        f"{folder}/ck",
        "--metrics-file",
        f"{folder}/metrics.jsonl",
    )
    try:
        run.wait_for("epoch 2/20:")
        with contextlib.ExitStack() as lost:
            gone = (
                kill_worker(cluster, "node_2")
                if loss == "worker killed"
                else lost.enter_context(cluster.link_down(cluster.nodes[1]))
            )
            resumed = run.wait_for("resuming from", timeout=180)
            stepped = first_step_after(run, resumed)
            status = launcher(cluster, "status", "--env-file", str(env_file)).stdout
            exit_status, output, stderr = run.finish()
    finally:
        if run.process.poll() is None:  # a failed assertion: the next test starts on clean nodes
            launcher(cluster, "stop", "--env-file", str(env_file))
            run.finish()
    measured(
        f"{loss} on node_2: training again on node_1,node_3 {stepped - gone:.1f} s later (resumed after "
        f"{resumed - gone:.1f} s); exit status {exit_status}"
    )
    assert re.search(r"node_3: \S+ role=spare ", status), status
    assert exit_status == 0, stderr[-3000:] + output[-3000:]
    [line] = [line for line in stderr.splitlines() if "restart 1/1: " in line]
    reason = "node_2 went silent" if loss == "link down" else "node_2's worker was lost"
    assert f"restart 1/1: {reason}; resuming after epoch " in line and line.endswith(" on node_1,node_3"), line
    records = [json.loads(line) for line in node_file(cluster, "node_1", f"{folder}/metrics.jsonl").splitlines()]
    assert [record["epoch"] for record in records] == list(range(1, 21))
    assert {record["world_size"] for record in records} == {2}
    assert records[-1]["val_accuracy"] >= 0.9
    assert_nothing_left(cluster)
