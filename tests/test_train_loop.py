"""The training loop's own rules (app/train_loop.py), on a one-rank stand-in framework: what the loop asks of the
framework, in which order, with which learning rate; the real frameworks run it in tests/test_train_integration.py
(PyTorch, 2 ranks, elastic too) and tests/test_tensorflow.py (Keras, in the image)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.extras import skip_module_without

skip_module_without("numpy")

import numpy as np  # noqa: E402

from app import observe, train_loop  # noqa: E402
from app.config import TrainConfig  # noqa: E402
from app.run_record import ResetLog  # noqa: E402
from app.train_loop import Batch, FixedProgress  # noqa: E402


class OneRank:
    """Horovod's rank, size and local rank of a job of one."""

    @staticmethod
    def rank() -> int:
        return 0

    @staticmethod
    def size() -> int:
        return 1


class StandIn:
    """A framework whose epoch is `steps` batches of `batch` samples; it records what the loop asked of it."""

    hvd = OneRank
    checkpoint_file = "latest.json"

    def __init__(self, steps: int, batch: int = 4) -> None:
        self.steps, self.batch, self.lr = steps, batch, 0.0
        self.calls: list[str] = []

    def batches(self, epoch: int, progress: Any) -> Iterator[Batch]:
        while progress.done < self.steps:
            yield Batch(progress.done / self.steps, self.steps, self.batch, lambda lr: self.step(progress, lr))

    def step(self, progress: Any, lr: float) -> float:
        self.lr = lr
        self.calls.append(f"step {progress.epoch}.{progress.done} lr {lr:.3f}")
        progress.done += 1
        return 0.5

    def next_epoch(self, progress: Any, epoch: int) -> None:
        self.calls.append(f"next epoch {epoch}")
        progress.done = 0

    def evaluate(self) -> tuple[float, float, int]:
        return 3.0, 9.0, 10

    def learning_rate(self) -> float:
        return self.lr

    def write_checkpoint(self, directory: Path, meta: dict[str, Any]) -> None:
        self.calls.append(f"checkpoint {meta}")

    def allreduce(self, values: np.ndarray, op: str, name: str) -> np.ndarray:
        return values


class Recorded(FixedProgress):
    """FixedProgress that notes the elastic State's hooks the loop calls, in the stand-in's list."""

    def __init__(self, calls: list[str], **fields: Any) -> None:
        super().__init__(**fields)
        self.calls = calls

    def commit(self) -> None:
        self.calls.append("commit")

    def save(self) -> None:
        self.calls.append(f"save at epoch {self.epoch}")


def test_the_loop_commits_every_n_steps_and_saves_before_it_records_the_epoch(tmp_path):
    config = TrainConfig(
        epochs=2, base_lr=0.1, warmup_epochs=0.5, commit_every=2, metrics_file=tmp_path / "m.jsonl",
        checkpoint_dir=tmp_path,
    )  # fmt: skip
    framework = StandIn(steps=3)
    progress = Recorded(framework.calls, epoch=1, done=0)
    observer = observe.Observer(config, enabled=False)
    result = train_loop.train_epochs(config, framework, progress, ResetLog(OneRank.size), observer)  # type: ignore[arg-type]

    # Saved before rank 0 records (and checkpoints) the epoch: a failure in between resumes at the next epoch.
    assert framework.calls == [
        "step 1.0 lr 0.100",
        "step 1.1 lr 0.100",
        "commit",
        "step 1.2 lr 0.100",
        "next epoch 2",
        "save at epoch 2",
        "checkpoint {'epoch': 1, 'dataset': 'digits'}",
        "step 2.0 lr 0.100",
        "step 2.1 lr 0.100",
        "commit",
        "step 2.2 lr 0.100",
        "next epoch 3",
        "save at epoch 3",
        "checkpoint {'epoch': 2, 'dataset': 'digits'}",
    ]
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["train_loss"], r["val_loss"], r["val_accuracy"]) for r in records] == [
        (1, 0.5, 0.3, 0.9),
        (2, 0.5, 0.3, 0.9),
    ]
    assert result is not None and result.epoch == 2 and progress.epoch == 3


def test_the_warm_up_clock_is_the_epochs_done_plus_the_fraction_of_this_one():
    class TwoRanks(OneRank):
        @staticmethod
        def size() -> int:
            return 2

    config = TrainConfig(epochs=1, base_lr=0.1, warmup_epochs=1.0)
    framework = StandIn(steps=4)
    framework.hvd = TwoRanks
    observer = observe.Observer(config, enabled=False)
    progress = FixedProgress(epoch=1, done=0)
    train_loop.train_epochs(config, framework, progress, ResetLog(TwoRanks.size), observer)  # type: ignore[arg-type]
    # 0.1 -> 0.2 (two ranks) over the first epoch, a quarter of it per step.
    rates = [call.split()[-1] for call in framework.calls if call.startswith("step")]
    assert rates == ["0.100", "0.125", "0.150", "0.175"]
