"""What rank 0 shows and records: progress lines or a bar, TensorBoard scalars read back, curves.png at the end."""

import io
import logging

import pytest

from tests.extras import skip_module_without

skip_module_without("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from app import metrics  # noqa: E402
from app.config import TrainConfig  # noqa: E402
from app.observe import EPOCH_SCALARS, STEP_SCALARS, Observer, wants_bar  # noqa: E402
from tests.png import png_size  # noqa: E402


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def record(epoch: int) -> dict:
    return {
        "epoch": epoch,
        "epochs": 3,
        "train_loss": 1.0 / epoch,
        "val_loss": 1.1 / epoch,
        "val_accuracy": 0.8,
        "samples_per_sec": 900.0,
        "world_size": 2,
        "seconds": 0.4,
        "lr": 0.02,
    }


def run_epochs(observer: Observer, epochs: int = 2, steps: int = 8) -> None:
    for epoch in range(1, epochs + 1):
        for step in range(1, steps + 1):
            observer.step(
                epoch=epoch,
                step=step,
                steps=steps,
                global_step=(epoch - 1) * steps + step,
                loss=1.0 / step,
                lr=0.01 * epoch,
            )
        observer.epoch(record(epoch))


@pytest.mark.parametrize(
    "mode, terminal, under_open_mpi, bar",
    [
        ("auto", True, False, True),
        ("auto", False, False, False),
        ("auto", True, True, False),  # Open MPI's own pty, whatever mpirun writes to
        ("bar", False, True, True),
        ("lines", True, False, False),
    ],
)
def test_bar_or_lines(mode, terminal, under_open_mpi, bar, monkeypatch):
    if under_open_mpi:
        monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    else:
        monkeypatch.delenv("OMPI_COMM_WORLD_SIZE", raising=False)
    assert wants_bar(mode, Terminal() if terminal else io.StringIO()) is bar


def test_lines_about_four_per_epoch(caplog):
    caplog.set_level(logging.INFO)
    run_epochs(Observer(TrainConfig(progress="lines"), enabled=True, stream=io.StringIO()), epochs=1)
    assert [r.getMessage() for r in caplog.records] == [
        f"epoch 1 [{step}/8 batches] loss {1 / step:.4f} lr 0.0100" for step in (2, 4, 6, 8)
    ]


def test_bar_per_epoch_instead_of_lines(caplog):
    caplog.set_level(logging.INFO)
    stream = io.StringIO()
    run_epochs(Observer(TrainConfig(epochs=2, progress="bar"), enabled=True, stream=stream))
    shown = stream.getvalue()
    assert "epoch 1/2" in shown and "epoch 2/2" in shown and "8/8" in shown and "loss=0.1250" in shown
    assert caplog.records == []


def test_tensorboard_scalars_per_step_and_per_epoch(tmp_path):
    observer = Observer(TrainConfig(tensorboard_dir=tmp_path / "tb", progress="lines"), enabled=True)
    run_epochs(observer)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()  # flushed per epoch: readable before the writer closes
    assert set(events.Tags()["scalars"]) == {*EPOCH_SCALARS, *STEP_SCALARS}
    assert [e.step for e in events.Scalars("epoch/val_loss")] == [1, 2]
    assert [e.value for e in events.Scalars("epoch/world_size")] == [2, 2]
    assert [e.step for e in events.Scalars("step/loss")] == [2, 4, 6, 8, 10, 12, 14, 16]
    assert events.Scalars("step/lr")[-1].value == pytest.approx(0.02)
    observer.finish()


def test_finish_draws_curves_beside_the_metrics(tmp_path):
    metrics_file = tmp_path / "metrics.jsonl"
    config = TrainConfig(metrics_file=metrics_file, progress="lines")
    for epoch in (1, 2, 3):
        metrics.append_record(metrics_file, record(epoch))
    Observer(config, enabled=True).finish()
    assert png_size(tmp_path / "curves.png") == (1300, 380)


def test_other_ranks_show_and_write_nothing(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    metrics_file = tmp_path / "metrics.jsonl"
    config = TrainConfig(metrics_file=metrics_file, tensorboard_dir=tmp_path / "tb")
    metrics.append_record(metrics_file, record(1))
    stream = io.StringIO()
    observer = Observer(config, enabled=False, stream=stream)
    run_epochs(observer)
    observer.finish()
    assert stream.getvalue() == "" and caplog.records == []
    assert not (tmp_path / "tb").exists() and not (tmp_path / "curves.png").exists()
