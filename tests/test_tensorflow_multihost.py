"""`launcher start --image horovod-stack:tensorflow` across the two test hosts (tests/multihost.py): the Keras trainer
on both nodes, `doctor`, `status` and `stacks` on that image, and a fixed job that loses a node restarted
from its TensorFlow checkpoint (--max-restarts).

Both nodes are given the image as hard links to this machine's engine's layers (tests/multihost.py's link_image): the
push itself is the same code for any image and is tested with the PyTorch image (tests/test_launcher_multihost.py),
while two 7.4 GB loads would cost this machine's disk and minutes it cannot spare. Each test stops its own job however
it ends; the module removes the image from the test hosts at its end.
"""

from __future__ import annotations

import json
import re
import time

import docker
import pytest

from app.frameworks import PYTORCH
from tests.multihost import Cluster
from tests.test_examples import launch_example_as_typed
from tests.test_launcher_multihost import BackgroundLaunch, assert_nothing_left, kill_worker, launcher
from tests.test_launcher_multihost import start_args as env_file_args
from tests.test_tensorflow import TF_IMAGE

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(test_hosts: Cluster):
    for node in test_hosts.nodes:
        test_hosts.ensure_image(TF_IMAGE, node)
    try:
        yield test_hosts
    finally:
        for node in test_hosts.every_node:  # the test hosts' disk goes back to the other modules
            if test_hosts.has_image(TF_IMAGE, node):
                node.client().images.remove(TF_IMAGE, force=True)


@pytest.fixture
def stopped_after(cluster: Cluster):
    """The test's job and containers removed however the test ends, so a failure here fails nothing after it."""
    yield cluster
    launcher(cluster, "stop", "--env-file", str(cluster.env_file()))


def start_args(cluster: Cluster, *extra: str) -> list[str]:
    return env_file_args(cluster, "--image", TF_IMAGE, *extra)


def node_file(cluster: Cluster, path: str) -> str:
    """A file of the stack's shared volume on node_1, read in a container of the image."""
    return cluster.nodes[0].client().containers.run(TF_IMAGE, ["cat", path], volumes={"horovod-stack-shared": {
        "bind": "/shared", "mode": "ro"}}, remove=True).decode()  # fmt: skip


def test_doctor_checks_both_nodes_for_the_tensorflow_image(stopped_after):
    cluster = stopped_after
    result = launcher(cluster, "doctor", "--env-file", str(cluster.env_file()), "--image", TF_IMAGE)
    assert result.returncode == 0, result.stdout + result.stderr
    image_id = docker.from_env().images.get(TF_IMAGE).id[7:19]
    for node in ("node_1", "node_2"):
        assert re.search(rf"{node}: image\s+ok \({image_id}\)", result.stdout), result.stdout
    assert "all nodes ready" in result.stdout, result.stdout


def test_the_keras_trainer_trains_across_both_hosts_to_095_with_identical_parameters(stopped_after, measured):
    cluster = stopped_after
    folder = f"/shared/runs/keras-{int(time.time())}"
    started = time.monotonic()
    result = launcher(cluster, *start_args(cluster, "--push-image", "--nodes", "node_1,node_2"), "--", "--dataset",
                      "digits", "--epochs", "5", "--summary-file", f"{folder}/summary.json",
                      "--metrics-file", f"{folder}/metrics.jsonl")  # fmt: skip
    measured(f"Keras trainer, 5 epochs of digits on 2 nodes: {time.monotonic() - started:.0f} s in all")
    assert result.returncode == 0, result.stderr[-5000:] + result.stdout[-3000:]
    assert "pushing" not in result.stderr  # both nodes hold it: --push-image copies nothing
    assert "parameters identical on all 2 ranks" in result.stdout
    summary = json.loads(node_file(cluster, f"{folder}/summary.json"))
    assert summary["final"]["val_accuracy"] >= 0.95, summary["final"]
    assert [rank["host"] for rank in summary["ranks"]] == ["node-1", "node-2"]
    assert_nothing_left(cluster)
    # The containers are gone with the attached job; its output stays in its run folder.
    logs = launcher(
        cluster,
        "logs",
        "--env-file",
        str(cluster.env_file()),
        "--image",
        TF_IMAGE,
        "--rank",
        "0",
        "--grep",
        "epoch 5/5",
    )
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()
    assert lines and all("[rank 0] epoch 5/5:" in line for line in lines), logs.stdout
    assert "note: the job's containers are gone: its output as run " in logs.stderr, logs.stderr


def test_the_keras_example_trains_on_both_hosts_as_the_readme_types_it(stopped_after, measured):
    """README.md's `launcher start --nodes node_1,node_2 --image horovod-stack:tensorflow --workdir ./examples --
    python keras_digits.py`: the example learns the digits on both nodes, its ranks end with the same weights."""
    cluster = stopped_after
    launch_example_as_typed(
        "keras_digits.py", lambda words: launcher(cluster, *env_file_args(cluster), *words[1:]), measured
    )
    assert_nothing_left(cluster)


def test_a_keras_job_that_loses_a_node_restarts_from_its_tensorflow_checkpoint(stopped_after, measured):
    """--max-restarts 1 --min-nodes 1: `launcher stacks` shows the Keras trainer's frames while it runs; node_2's
    worker is then killed, and the job's agent starts it again on node_1 alone, resuming from latest.npz."""
    cluster = stopped_after
    folder = f"/shared/runs/keras-restart-{int(time.time())}"
    run = BackgroundLaunch(cluster, *start_args(cluster, "--max-restarts", "1", "--min-nodes", "1"), "--",
                           "--dataset", "synthetic", "--epochs", "60", "--checkpoint-dir", f"{folder}/ck",
                           "--metrics-file", f"{folder}/metrics.jsonl")  # fmt: skip
    run.wait_for("epoch 2/60:")
    status = launcher(cluster, "status", "--env-file", str(cluster.env_file()))
    assert re.search(r"running: epoch \d+ of 60, val accuracy", status.stdout), status.stdout + status.stderr
    stacks = launcher(cluster, "stacks", "--env-file", str(cluster.env_file()))
    assert stacks.returncode == 0, stacks.stdout[-3000:] + stacks.stderr[-3000:]
    assert "train_keras.py" in stacks.stdout, stacks.stdout[-3000:]
    killed = kill_worker(cluster, "node_2")
    resumed = run.wait_for("resuming from", timeout=180)
    exit_status, output, stderr = run.finish()
    measured(f"Keras job: node_2's worker killed, the restarted job resumed {resumed - killed:.1f} s later")
    assert exit_status == 0, stderr[-3000:] + output[-3000:]
    assert "restart 1/1: node_2's worker was lost; resuming after epoch " in stderr, stderr[-3000:]
    assert re.search(r"resuming from \S+/ck/latest\.npz after epoch \d", output), output[-3000:]
    records = [json.loads(line) for line in node_file(cluster, f"{folder}/metrics.jsonl").splitlines()]
    assert [record["epoch"] for record in records] == list(range(1, 61))
    assert records[0]["world_size"] == 2 and records[-1]["world_size"] == 1
    assert records[-1]["val_accuracy"] >= 0.9
    assert_nothing_left(cluster)


def test_a_tensorflow_jobs_status_logs_and_results_ask_no_engine_for_the_pytorch_image(stopped_after, tmp_path):
    """On nodes that hold only horovod-stack:tensorflow: a detached job's status names its image and framework (the
    cluster's record), and its logs and results, while its containers are kept and after `stop` removed them, read
    the shared folder with that image: no engine is asked to pull horovod-stack:latest."""
    cluster = stopped_after
    for node in cluster.every_node:
        try:
            node.client().images.remove(PYTORCH.image, force=True)  # later modules link it again (ensure_image)
        except docker.errors.ImageNotFound:
            pass
    held = {node.name: sorted(tag for image in node.client().images.list() for tag in image.tags) for node in
            cluster.every_node}  # fmt: skip
    assert all(PYTORCH.image not in tags for tags in held.values()), held
    # The commands as a user on these nodes types them: no IMAGE in .env (a branch's PyTorch build there would be asked
    # for by name), and no --image for status, logs and results.
    env_file = tmp_path / "tf.env"
    env_file.write_text("".join(line + "\n" for line in cluster.env_file().read_text().splitlines()
                                if not line.startswith("IMAGE=")))  # fmt: skip
    since = int(time.time()) - 1
    started = launcher(cluster, "start", "--env-file", str(env_file), "--image", TF_IMAGE, "--detach", "--",
                       "--dataset", "digits", "--epochs", "1")  # fmt: skip
    assert started.returncode == 0, started.stderr[-3000:]
    cluster_id = re.search(r"detached: cluster (\w+)", started.stderr)
    assert cluster_id, started.stderr[-3000:]
    deadline = time.monotonic() + 300
    while "succeeded" not in (status := launcher(cluster, "status", "--env-file", str(env_file))).stdout:
        assert time.monotonic() < deadline and "failed" not in status.stdout, status.stdout + status.stderr
        time.sleep(3)
    assert f"cluster {cluster_id[1]}: succeeded" in status.stdout
    assert f"  image {TF_IMAGE} (TensorFlow)" in status.stdout.splitlines(), status.stdout

    def logs_and_results(into: str) -> str:
        logs = launcher(cluster, "logs", "--env-file", str(env_file), "--rank", "0", "--grep", "epoch 1/1")
        assert logs.returncode == 0, logs.stderr
        assert logs.stdout and all("[rank 0] epoch 1/1:" in line for line in logs.stdout.splitlines()), logs.stdout
        results = launcher(cluster, "results", "--env-file", str(env_file), "--to", str(tmp_path / into))
        assert results.returncode == 0, results.stderr
        assert (tmp_path / into / cluster_id[1] / "metrics.jsonl").is_file(), results.stdout
        return logs.stderr

    assert "containers are gone" not in logs_and_results("kept")  # read from the kept containers and their record
    stopped = launcher(cluster, "stop", "--env-file", str(env_file))
    assert stopped.returncode == 0, stopped.stderr
    assert "note: the job's containers are gone" in logs_and_results("removed")  # the node's own image, no record
    pulls = {node.name: [event for event in node.client().events(since=since, until=int(time.time()) + 1, decode=True,
                         filters={"type": "image", "event": "pull"})] for node in cluster.every_node}  # fmt: skip
    assert pulls == {node.name: [] for node in cluster.every_node}
    assert {node.name: sorted(tag for image in node.client().images.list() for tag in image.tags) for node in
            cluster.every_node} == held  # fmt: skip
