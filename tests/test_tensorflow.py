"""horovod-stack:tensorflow run for real: the bundled Keras trainer through `docker compose up`, the Keras 3 and Keras 2
checks of tests/tensorflow/ through the smoke role (and Keras 2 code without TF_USE_LEGACY_KERAS=1, failing in a line
that names it), a resumed run, an elastic job that loses a worker, a script of the other framework on each image, and
each image's framework label. Needs the image (scripts/build-images.sh tensorflow, which scripts/test.sh runs).

The benches that compare Horovod with TensorFlow's own strategy and each image's allreduce run here at their
smallest; the launcher across the test hosts with this image is tests/test_tensorflow_multihost.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from app.frameworks import PYTORCH, TENSORFLOW, wrong_image_message
from app.gpu import BUILDS, FRAMEWORK_LABEL, build_of
from launcher.core.legacy_keras import ERROR, explained
from tests.test_compose import ComposeRun

pytestmark = pytest.mark.integration

TF_IMAGE = os.environ.get("TENSORFLOW_IMAGE", TENSORFLOW.image)
TORCH_IMAGE = os.environ.get("IMAGE", PYTORCH.image)
TESTS = Path(__file__).resolve().parent
CHECKS = TESTS / "tensorflow"


@pytest.fixture(scope="module", autouse=True)
def image() -> str:
    found = subprocess.run(["docker", "image", "inspect", TF_IMAGE], capture_output=True, text=True)
    assert found.returncode == 0, f"{TF_IMAGE} is not built here: scripts/build-images.sh tensorflow"
    return TF_IMAGE


def run_in_image(*argv: str, image: str = TF_IMAGE, timeout: float = 300, docker: tuple[str, ...] = ()):
    done = subprocess.run(["docker", "run", "--rm", *docker, image, *argv], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    print(f"{' '.join(argv)[:200]}: exit {done.returncode}\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
    return done


def test_each_image_names_its_framework_for_the_launchers_gpu_check():
    for image, framework in ((TF_IMAGE, TENSORFLOW), (TORCH_IMAGE, PYTORCH)):
        labels = docker.from_env().images.get(image).labels
        assert labels[FRAMEWORK_LABEL] == framework.name
        assert build_of(labels) is BUILDS[framework.name]


def test_compose_up_trains_the_keras_trainer_to_095_on_two_workers(tmp_path):
    """`IMAGE=horovod-stack:tensorflow docker compose up`, as the README's TensorFlow line types it."""
    workdir = tmp_path / "checkout"
    workdir.mkdir()
    run = ComposeRun(workdir, IMAGE=TF_IMAGE)
    try:
        result = run.compose("up", "--exit-code-from", "launcher")
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-5000:]
        assert "2/2 workers answer over ssh" in output
        assert "parameters identical on all 2 ranks" in output
        epochs = [json.loads(line) for line in run.read_shared("runs/latest/metrics.jsonl").splitlines()]
        assert [epoch["epoch"] for epoch in epochs] == [1, 2, 3, 4, 5]
        assert epochs[-1]["val_accuracy"] >= 0.95, epochs[-1]
        summary = json.loads(run.read_shared("runs/latest/summary.json"))
        assert summary["world_size"] == 2 and len({rank["host"] for rank in summary["ranks"]}) == 2
        assert run.read_shared("runs/latest/curves.png", binary=True)[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        run.down()


@pytest.mark.parametrize("check", ["keras3_tape", "keras3_fit", "keras2_tape", "keras2_fit"])
def test_keras_code_runs_on_two_ranks_through_the_smoke_role_and_ends_identical(check):
    """Keras 3 (the default) and Keras 2 code written for Horovod (TF_USE_LEGACY_KERAS=1, as the Keras team
    documents it), each a user's script run as a CI job runs it: `docker run -v CHECKOUT:/workdir IMAGE smoke`."""
    keras2 = ("-e", "TF_USE_LEGACY_KERAS=1") if check.startswith("keras2") else ()
    done = run_in_image("smoke", "--np", "2", "--", "python", f"{check}.py",
                        docker=(*keras2, "-v", f"{CHECKS}:/workdir:ro", "-w", "/workdir"))  # fmt: skip
    assert done.returncode == 0
    assert "identical on every rank: True" in done.stdout


def test_keras2_code_without_the_setting_fails_in_a_line_that_names_it():
    """tests/tensorflow/keras2_tape.py, Horovod's TensorFlow 2 examples in miniature (tf.optimizers.SGD,
    opt.variables()), through the smoke role as a CI job runs it, without TF_USE_LEGACY_KERAS=1 (with it, it trains:
    the test above): the last line names the setting and how to give it (launcher/core/legacy_keras.py), Python's
    error after it."""
    done = run_in_image("smoke", "--np", "2", "--", "python", "keras2_tape.py",
                        docker=("-v", f"{CHECKS}:/workdir:ro", "-w", "/workdir"))  # fmt: skip
    last = done.stdout.strip().splitlines()[-1]
    assert done.returncode != 0 and last.startswith("smoke: failed: rank "), last
    assert explained(None, "smoke") in last and ERROR in last, last


def test_a_resumed_run_continues_after_its_checkpoint_with_the_same_files():
    """Two epochs, then --resume to three, as a restart (--max-restarts) resumes: one metrics file of epochs 1-3."""
    train = "horovodrun -np 2 -H localhost:2 --gloo python -m app.train --dataset synthetic --run-dir /tmp/run"
    both = f"{train} --epochs 2 && {train} --epochs 3 --resume && cat /tmp/run/metrics.jsonl"
    done = run_in_image("bash", "-c", both, timeout=400)
    assert done.returncode == 0
    assert "resuming from /tmp/run/checkpoints/latest.npz after epoch 2" in done.stdout
    epochs = [json.loads(line)["epoch"] for line in done.stdout.splitlines() if line.startswith("{")]
    assert epochs == [1, 2, 3]


ELASTIC_JOB = r"""
echo 'localhost:1
127.0.0.1:1' > /tmp/hosts
printf '#!/bin/sh\ncat /tmp/hosts\n' > /tmp/discover.sh && chmod +x /tmp/discover.sh
horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script /tmp/discover.sh --network-interface lo \
  $COMMAND > /tmp/job.log 2>&1 &
job=$!
for _ in $(seq 240); do grep -q "$KILL_AFTER" /tmp/job.log && break; sleep 0.5; done
echo localhost:1 > /tmp/hosts
for pid in $(pgrep -f "$COMMAND"); do
  tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | grep -qx 'HOROVOD_HOSTNAME=127.0.0.1' && kill -9 $pid
done
wait $job; status=$?
cat /tmp/job.log; cat /tmp/run/summary.json 2>/dev/null; exit $status
"""
"""COMMAND on two "hosts" of one container (localhost and 127.0.0.1), the second's rank killed once the job's output
shows KILL_AFTER and the host dropped from discovery, so the job goes on without it; then the job's output (and the
bundled trainer's summary.json, where it wrote one)."""


def elastic_job(command: str, kill_after: str, *docker: str):
    return run_in_image("bash", "-c", ELASTIC_JOB, timeout=500,
                        docker=("-e", f"COMMAND={command}", "-e", f"KILL_AFTER={kill_after}", *docker))  # fmt: skip


def test_an_elastic_job_loses_a_worker_and_finishes_on_the_other():
    """The bundled trainer's --elastic (a custom loop with a Keras 3 model under hvd.elastic): a worker killed after
    epoch 1, the other rolls back to its last commit and finishes alone."""
    done = elastic_job("python -m app.train --elastic --dataset digits --epochs 6 --batch-size 8 --commit-every 5 "
                       "--run-dir /tmp/run", "epoch 1/6")  # fmt: skip
    assert done.returncode == 0
    summary = json.loads(done.stdout[done.stdout.index('{\n  "world_size"') :])
    assert summary["world_size"] == 1
    assert [(event["from_size"], event["to_size"]) for event in summary["elastic_resets"]] == [(2, 1)]
    assert "epoch 6/6" in done.stdout


def test_keras_model_fit_under_hvd_elastic_loses_a_worker_and_finishes_every_epoch_on_the_other():
    """tests/tensorflow/keras3_fit_elastic.py: model.fit with Horovod's elastic Keras callbacks; its second rank
    killed after epoch 2, the first goes on from the last commit at world size 1 and ends at epoch 8, no epoch
    counted twice or skipped."""
    done = elastic_job("python keras3_fit_elastic.py", "epoch 2/8", "-v", f"{CHECKS}:/workdir:ro", "-w", "/workdir")
    assert done.returncode == 0
    # The survivor's lines: horovodrun may give either "host" the first rank, so the one killed is [0] or [1].
    finished = re.search(r"^(\[\d\]<stdout>:)finished: epoch 8/8 at world size 1$", done.stdout, re.M)
    assert finished, done.stdout[-3000:]
    epochs = [line for line in done.stdout.splitlines() if line.startswith(f"{finished[1]}epoch ")]
    numbers = [int(line.split()[1].split("/")[0]) for line in epochs]
    assert sorted(set(numbers)) == list(range(1, 9)) and numbers[-1] == 8, epochs
    assert "at world size 2" in epochs[0] and "at world size 1" in epochs[-1], epochs


def test_a_pytorch_script_on_the_tensorflow_image_fails_in_one_line_naming_the_pytorch_image(tmp_path):
    (tmp_path / "train.py").write_text("import torch\nimport horovod.torch as hvd\n")
    done = run_in_image("smoke", "--np", "2", "--", "python", "train.py",
                        docker=("-v", f"{tmp_path}:/workdir:ro", "-w", "/workdir"))  # fmt: skip
    assert done.returncode != 0
    assert wrong_image_message("torch", TENSORFLOW) in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_a_tensorflow_script_on_the_pytorch_image_fails_in_one_line_naming_the_tensorflow_image():
    done = run_in_image("python", "-c", "import tensorflow", image=TORCH_IMAGE, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [wrong_image_message("tensorflow", PYTORCH)]


def test_the_benches_compare_horovod_with_tensorflows_strategy_and_each_images_allreduce(tmp_path):
    """`tf-peers --short` in the image, and `allreduce --images` (a host-side run of the bench in a container of each
    image): well-formed tables with figures in every cell, never a speed asserted."""
    done = run_in_image("python", "-m", "app.bench", "tf-peers", "--short", "--out", "/tmp/out", timeout=400)
    assert done.returncode == 0
    row = next(line for line in done.stdout.splitlines() if line.startswith("| simplenet |"))
    assert all(cell.strip() and cell.strip() != "-" for cell in row.strip("|").split("|")), row
    images = subprocess.run([sys.executable, "-m", "app.bench", "allreduce", "--short", "--peers", "hvd-mpi",
                             "--images", TORCH_IMAGE, TF_IMAGE, "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=400)  # fmt: skip
    assert images.returncode == 0, images.stdout[-3000:] + images.stderr[-3000:]
    rows = json.loads((tmp_path / "allreduce-images.json").read_text())["rows"]
    assert [row["size"] for row in rows] == ["4 KB", "64 KB"]
    for image in (TORCH_IMAGE, TF_IMAGE):
        assert all(row[f"{image}|hvd-mpi_busbw"] > 0 for row in rows), rows
