"""The framework a job runs: the plan names it from the image, the cluster's containers record the image (and the
framework), and `status`, `logs` and `results` read that record, so that on nodes that hold only
horovod-stack:tensorflow none of them asks an engine for horovod-stack:latest (the real engines:
tests/test_tensorflow_multihost.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app import frameworks
from app.entrypoint import TRAINER
from app.frameworks import PYTORCH, TENSORFLOW
from launcher.core.jobend import JobEnd
from launcher.core.protocol import JOB_STATUS
from launcher.host.planning.plan import LABEL_METRICS
from launcher.host.running import clusters
from tests.conftest import plan_of
from tests.standins import container
from tests.test_log_tail import EndedNode

RUN = {"c1": (200, {"job.log": b"[1,0]<stdout>:epoch 1\n", "summary.json": b"{}"})}


@pytest.mark.parametrize(
    "image, framework",
    [
        ("horovod-stack:tensorflow", TENSORFLOW),
        ("registry.example.com:5000/team/horovod-stack:tensorflow", TENSORFLOW),
        ("horovod-stack:latest", PYTORCH),
        ("registry.example.com/horovod-stack:latest", PYTORCH),
        ("myorg/train:1", None),
        ("horovod-stack:tensorflow-old", None),
    ],
)
def test_the_framework_of_an_image_by_its_name(image, framework):
    assert frameworks.of_image(image) is framework


@pytest.mark.parametrize(
    "image, framework",
    [("horovod-stack:tensorflow", "TensorFlow"), ("horovod-stack:latest", "PyTorch"), ("myorg/train:1", None)],
)
def test_the_plan_names_the_framework_and_every_container_records_the_image(image, framework):
    plan = plan_of(image=image)
    for node in plan.nodes:
        labels = plan.labels(node)
        assert labels["horovod-stack.image"] == image
        assert labels.get("horovod-stack.framework") == framework  # unknown: the image's own label shows through
    assert f"image {image}{f' ({framework})' if framework else ''}, ssh port" in plan.describe()


class HoldingNode(EndedNode):
    """A node that holds only `held` images: reading its shared folder with any other would be a pull."""

    def __init__(self, name, runs, held, containers=()):
        super().__init__(name, runs)
        self.held, self.containers, self.read_with = held, list(containers), []

    def cluster_containers(self, cluster_id=None):
        return self.containers

    def image_id(self, image):
        return f"sha256:{image}" if image in self.held else None

    def list_runs(self, image, shared_dir):
        self.read_with.append(image)
        assert image in self.held, f"asked to pull {image}"
        return super().list_runs(image, shared_dir)

    def run_entries(self, image, shared_dir, name):
        assert image in self.held, f"asked to pull {image}"
        return super().run_entries(image, shared_dir, name)

    def run_archive(self, image, shared_dir, name):
        self.read_with.append(image)
        assert image in self.held, f"asked to pull {image}"
        return super().run_archive(image, shared_dir, name)

    def read_file(self, container_id, path):
        if path.endswith("/metrics.jsonl"):
            return '{"epoch": 1, "epochs": 1, "val_accuracy": 0.95, "samples_per_sec": 10.0}\n'
        return JobEnd(0).to_json() if path == JOB_STATUS else None


def recorded(image: str):
    base = container("horovod-stack-c1-node_1", "c1", running=False)
    return replace(base, labels={**base.labels, "horovod-stack.image": image, "horovod-stack.framework": "TensorFlow"})


TF = "horovod-stack:tensorflow"


@pytest.mark.parametrize(
    "wanted, held, containers, expected",
    [
        (None, {TF}, [], TF),  # the containers gone: the stack's image the node holds
        (None, {TF, PYTORCH.image}, [], PYTORCH.image),  # both held: the first of the stack's
        (None, {"myorg/train:1", PYTORCH.image}, [recorded("myorg/train:1")], "myorg/train:1"),  # the record first
        (None, {TF}, [recorded("myorg/gone:1")], TF),  # a recorded image the node no longer holds is passed over
        (None, set(), [], PYTORCH.image),  # nothing held: the default (a pull, as before)
        ("mine:2", {TF}, [recorded(TF)], "mine:2"),  # --image or IMAGE in .env: as asked
    ],
)
def test_the_image_that_reads_a_nodes_shared_folder(wanted, held, containers, expected):
    assert clusters.reading_image(HoldingNode("node_1", {}, held, containers), wanted) == expected


def test_on_nodes_holding_only_the_tensorflow_image_logs_and_results_read_with_it(tmp_path):
    nodes = [HoldingNode("node_1", RUN, {TF}), HoldingNode("node_2", {}, {TF})]
    own, job, note = clusters.logs(nodes, None, False, None, None, "horovod-stack-shared")
    assert b"".join(job) == b"[1,0]<stdout>:epoch 1\n" and note
    run, written = clusters.fetch_results(nodes, None, "horovod-stack-shared", None, tmp_path, checkpoints=False)
    assert run.name == "c1" and written == ["c1/job.log", "c1/summary.json"]
    assert {image for node in nodes for image in node.read_with} == {TF}


def test_status_shows_the_image_and_framework_the_cluster_recorded():
    node = HoldingNode("node_1", {}, {TF}, [recorded(TF)])
    lines = list(clusters.status([node]))
    assert lines[:2] == ["cluster c1: succeeded (exit status 0): epoch 1 of 1, val accuracy 0.9500, 10 samples/s",
                         f"  image {TF} (TensorFlow)"]  # fmt: skip


class MetricsNode(HoldingNode):
    """Rank 0's container records where its trainer writes its metrics (`metrics_label`: its --metrics-file)."""

    def __init__(self, metrics_label: str | None, metrics_at: str):
        base = recorded(TF)
        labels = {**base.labels, **({LABEL_METRICS: metrics_label} if metrics_label else {})}
        super().__init__("node_1", {}, {TF}, [replace(base, labels=labels)])
        self.metrics_at = metrics_at

    def read_file(self, container_id, path):
        if path == self.metrics_at:
            return '{"epoch": 3, "epochs": 20, "val_accuracy": 0.9, "samples_per_sec": 10.0}\n'
        return JobEnd(0).to_json() if path == JOB_STATUS else None


ELASTIC_METRICS = "/shared/runs/elastic-rejoin.jsonl"


@pytest.mark.parametrize(
    "metrics_label, metrics_at, progress",
    [
        (ELASTIC_METRICS, ELASTIC_METRICS, "epoch 3 of 20"),
        (ELASTIC_METRICS, "/shared/runs/c1/metrics.jsonl", "no epoch figures"),
        (None, "/shared/runs/c1/metrics.jsonl", "epoch 3 of 20"),  # no label (an older launcher's): the run folder's
    ],
)
def test_status_reads_the_metrics_file_rank_0s_container_records(metrics_label, metrics_at, progress):
    """A job given --metrics-file (or --run-dir) keeps its metrics there, not in the cluster's run folder; the
    record outlives the job (its spec does not: the agent removes it at the end)."""
    [line, *_] = clusters.status([MetricsNode(metrics_label, metrics_at)])
    assert line.startswith(f"cluster c1: succeeded (exit status 0): {progress}"), line


def test_the_plan_records_the_trainers_metrics_file_on_rank_0s_container():
    plan = plan_of(command=(*TRAINER, "--dataset", "digits", "--metrics-file", ELASTIC_METRICS))
    assert plan.labels(plan.rank0)[LABEL_METRICS] == ELASTIC_METRICS
    assert LABEL_METRICS not in plan.labels(plan.job_nodes[-1])
    assert plan_of(command=("python", "mine.py")).labels(plan.rank0).get(LABEL_METRICS) is None
