"""The trainer run for real: two Horovod ranks under horovodrun (Gloo) and under Open MPI's mpirun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.extras import skip_module_without

skip_module_without("torch", "tensorboard")

import torch  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from app.observe import EPOCH_SCALARS, STEP_SCALARS  # noqa: E402
from tests.png import png_size  # noqa: E402

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
TRAINER = ["python", "-m", "app.train"]
LAUNCHERS = {
    "gloo": ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo"],
    "mpi": [
        "mpirun",
        "--allow-run-as-root",
        "-np",
        "2",
        "-bind-to",
        "none",
        "-map-by",
        "slot",
        "-x",
        "PATH",
        "-x",
        "PYTHONPATH",
    ],
}


def trainer_env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}


def start_training(launcher: str, run_dir: Path, *args: str, output_flags: bool = True) -> subprocess.Popen:
    """The trainer under `launcher`, its output in run_dir/output.log; output_flags: metrics and summary files
    in run_dir by their own flags (else the test's args say where)."""
    outputs = ["--metrics-file", str(run_dir / "metrics.jsonl"), "--summary-file", str(run_dir / "summary.json")]
    command = LAUNCHERS[launcher] + TRAINER + (outputs if output_flags else []) + list(args)
    log = open(run_dir / "output.log", "a")
    return subprocess.Popen(
        command, cwd=REPO, env=trainer_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def train(
    launcher: str, run_dir: Path, *args: str, timeout: float = 300, output_flags: bool = True
) -> subprocess.CompletedProcess:
    process = start_training(launcher, run_dir, *args, output_flags=output_flags)
    try:
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(process.args, process.returncode, (run_dir / "output.log").read_text())


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("launcher", ["gloo", "mpi"])
def test_two_ranks_learn_digits_and_agree(launcher, tmp_path):
    result = train(launcher, tmp_path, "--dataset", "digits", "--epochs", "5")
    assert result.returncode == 0, result.stdout

    metrics = read_metrics(tmp_path)
    assert [m["epoch"] for m in metrics] == [1, 2, 3, 4, 5]
    for record in metrics:
        assert set(record) == {
            "epoch",
            "epochs",
            "train_loss",
            "val_loss",
            "val_accuracy",
            "samples_per_sec",
            "world_size",
            "seconds",
            "lr",
        }
        assert record["world_size"] == 2 and record["samples_per_sec"] > 0 and record["seconds"] > 0
    assert metrics[-1]["val_accuracy"] >= 0.90, metrics
    assert metrics[-1]["val_loss"] < metrics[0]["val_loss"]

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert len({r["digest"] for r in summary["ranks"]}) == 1, "ranks ended with different parameters"
    print(f"{launcher}: final val accuracy {metrics[-1]['val_accuracy']:.4f}")


def test_run_dir_holds_tensorboard_events_curves_and_metrics(tmp_path):
    run_dir = tmp_path / "runs" / "first"
    started = time.monotonic()
    result = train(
        "gloo", tmp_path, "--dataset", "digits", "--epochs", "2", "--run-dir", str(run_dir), output_flags=False
    )
    print(f"2 ranks, 2 epochs with --run-dir: {time.monotonic() - started:.1f} s")
    assert result.returncode == 0, result.stdout
    assert [m["epoch"] for m in read_metrics(run_dir)] == [1, 2]
    assert (run_dir / "summary.json").is_file() and (run_dir / "checkpoints" / "latest.pt").is_file()
    assert f"training curves in {run_dir / 'curves.png'}" in result.stdout
    width, height = png_size(run_dir / "curves.png")
    assert 800 <= width <= 2000 and 250 <= height <= 1000

    [event_file] = (run_dir / "tb").iterdir()  # rank 0 alone writes events
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {*EPOCH_SCALARS, *STEP_SCALARS}, event_file
    for tag in EPOCH_SCALARS:
        assert [e.step for e in events.Scalars(tag)] == [1, 2], tag
    assert [e.value for e in events.Scalars("epoch/world_size")] == [2, 2]
    for tag in STEP_SCALARS:
        steps = [e.step for e in events.Scalars(tag)]
        assert len(steps) >= 8 and steps == sorted(set(steps)), (tag, steps)


def test_resume_after_interrupted_run_continues_from_next_epoch(tmp_path):
    checkpoints = tmp_path / "ckpt"
    process = start_training(
        "mpi", tmp_path, "--dataset", "digits", "--epochs", "40", "--checkpoint-dir", str(checkpoints)
    )
    deadline = time.monotonic() + 240
    while not (checkpoints / "latest.pt").exists():
        assert process.poll() is None, (tmp_path / "output.log").read_text()
        assert time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.2)
    ranks = [child for child in psutil.Process(process.pid).children(recursive=True) if "app.train" in child.cmdline()]
    assert len(ranks) == 2
    for rank in ranks:  # every rank dies mid-run at once, as when the power goes
        rank.kill()
    assert process.wait(timeout=60) != 0

    saved_epoch = torch.load(checkpoints / "latest.pt", weights_only=True)["epoch"]
    assert 1 <= saved_epoch < 40

    result = train(
        "mpi",
        tmp_path,
        "--dataset",
        "digits",
        "--epochs",
        str(saved_epoch + 3),
        "--checkpoint-dir",
        str(checkpoints),
        "--resume",
    )
    assert result.returncode == 0, result.stdout
    assert f"resuming from {checkpoints / 'latest.pt'} after epoch {saved_epoch}" in result.stdout
    records = read_metrics(tmp_path)
    assert [m["epoch"] for m in records] == list(range(1, saved_epoch + 4))
    assert records[-1]["val_accuracy"] >= 0.90
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len({r["digest"] for r in summary["ranks"]}) == 1


def test_fp16_allreduce_and_adasum_train(tmp_path):
    result = train("mpi", tmp_path, "--dataset", "digits", "--epochs", "4", "--fp16-allreduce", "--use-adasum")
    assert result.returncode == 0, result.stdout
    assert "adasum, fp16 allreduce" in result.stdout
    assert read_metrics(tmp_path)[-1]["val_accuracy"] >= 0.85


def test_missing_mnist_stops_at_once_naming_the_flags(tmp_path):
    result = train("gloo", tmp_path, "--dataset", "mnist", "--data-dir", str(tmp_path / "empty"), timeout=240)
    assert result.returncode != 0
    errors = [line for line in result.stdout.splitlines() if "error: MNIST is not under --data-dir" in line]
    assert errors and "--dataset digits" in errors[0], result.stdout
    assert not (tmp_path / "metrics.jsonl").exists()


def test_bad_value_under_mpirun_fails_before_training(tmp_path):
    result = train("mpi", tmp_path, "--batch-size", "-4", timeout=120)
    assert result.returncode != 0
    assert "error: --batch-size must be a positive integer (got -4)" in result.stdout
    assert "epoch" not in result.stdout


def test_elastic_mode_trains_under_horovodrun_with_host_discovery(tmp_path):
    """--elastic under horovodrun's elastic driver (Gloo), as the launcher and compose start it; losing and regaining
    workers is shown across containers and hosts (test_compose.py, test_launcher_multihost.py)."""
    discovery = tmp_path / "hosts.sh"
    discovery.write_text("#!/bin/sh\necho localhost:2\n")
    discovery.chmod(0o755)
    command = [
        "horovodrun",
        "-np",
        "2",
        "--min-np",
        "1",
        "--max-np",
        "2",
        "--host-discovery-script",
        str(discovery),
        "--network-interface",
        "lo",
        *TRAINER,
        "--elastic",
        "--dataset",
        "digits",
        "--epochs",
        "3",
        "--commit-every",
        "5",
        "--run-dir",
        str(tmp_path / "run"),
    ]
    result = subprocess.run(command, cwd=REPO, env=trainer_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics] == [1, 2, 3] and {m["world_size"] for m in metrics} == {2}
    assert metrics[-1]["val_accuracy"] >= 0.85, metrics[-1]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["elastic_resets"] == [] and len({r["digest"] for r in summary["ranks"]}) == 1
