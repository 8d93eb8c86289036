"""`python -m app.report RUN_DIR` on the folders runs leave: interrupted, finished, empty."""

import json
import subprocess
import sys
from pathlib import Path

from app import metrics
from tests.extras import needs
from tests.png import png_size

pytestmark = needs("matplotlib")  # app.report draws the curves

REPO = Path(__file__).resolve().parents[1]


def write_run(run_dir: Path, epochs: int, finished: bool) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    for epoch in range(1, epochs + 1):
        metrics.append_record(
            run_dir / "metrics.jsonl",
            {
                "epoch": epoch,
                "epochs": epochs,
                "train_loss": 1.0 / epoch,
                "val_loss": 1.2 / epoch,
                "val_accuracy": 0.5 + 0.1 * epoch,
                "samples_per_sec": 1000.0 * epoch,
                "world_size": 2,
                "seconds": 0.5,
                "lr": 0.02,
            },
        )
    if finished:
        (run_dir / "summary.json").write_text(json.dumps({"world_size": 2, "final": {"epoch": epochs}}))


def report(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.report", str(run_dir)], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_interrupted_run_gets_its_table_and_a_fresh_picture(tmp_path):
    write_run(tmp_path, epochs=3, finished=False)
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write('{"epoch": 4, "train_')  # killed while writing epoch 4's record
    result = report(tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "epoch",
        "train",
        "loss",
        "val",
        "loss",
        "val",
        "acc",
        "lr",
        "samples/s",
        "seconds",
        "ranks",
    ]
    assert [line.split()[0] for line in lines[1:4]] == ["1", "2", "3"]
    assert lines[3].split() == ["3", "0.3333", "0.4000", "0.8000", "0.0200", "3000", "0.5", "2"]
    assert lines[4] == (
        "interrupted (no summary.json; or still running): 3 epoch(s), last epoch 3, best val accuracy "
        "0.8000 (epoch 3), median 2000 samples/s"
    )
    assert lines[5] == f"curves: {tmp_path / 'curves.png'}"
    width, height = png_size(tmp_path / "curves.png")
    assert 800 <= width <= 2000 and 250 <= height <= 1000


def test_finished_run_and_a_record_without_lr(tmp_path):
    write_run(tmp_path, epochs=2, finished=True)
    with open(tmp_path / "metrics.jsonl", "a") as handle:  # as written before records held the learning rate
        handle.write(
            json.dumps(
                {
                    "epoch": 3,
                    "train_loss": 0.2,
                    "val_loss": 0.3,
                    "val_accuracy": 0.6,
                    "samples_per_sec": 500.0,
                    "world_size": 1,
                    "seconds": 1.0,
                }
            )
            + "\n"
        )
    result = report(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[3].split()[4] == "-"
    assert (
        "finished: 3 epoch(s), last epoch 3, best val accuracy 0.7000 (epoch 2), median 1000 samples/s" in result.stdout
    )


def test_folder_without_metrics_is_one_line_and_status_2(tmp_path):
    result = report(tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: {tmp_path} holds no metrics.jsonl: pass the folder a run wrote to (its --run-dir, or the folder "
        "of its --metrics-file)"
    ]
    (tmp_path / "metrics.jsonl").write_text("")
    result = report(tmp_path)
    assert result.returncode == 2 and "has no epoch yet" in result.stderr
