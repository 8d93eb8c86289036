"""Checkpoints: a write cut short leaves the previous one readable and no debris; reading one back runs no code."""

import os
from pathlib import Path

import pytest

from tests.extras import skip_module_without

skip_module_without("numpy", "torch")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from app import checkpoint, train_loop  # noqa: E402
from app.config import TrainConfig  # noqa: E402
from app.model import SimpleNet  # noqa: E402


def test_round_trip(tmp_path):
    checkpoint.save_checkpoint(tmp_path, {"epoch": 3, "weights": torch.arange(4)})
    state = checkpoint.load_latest_checkpoint(tmp_path)
    assert state is not None and state["epoch"] == 3 and torch.equal(state["weights"], torch.arange(4))


def test_missing_checkpoint_is_none(tmp_path):
    assert checkpoint.load_latest_checkpoint(tmp_path) is None


def test_crash_mid_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    checkpoint.save_checkpoint(tmp_path, {"epoch": 1})
    real_save = torch.save

    def save_half_then_crash(obj, handle):
        real_save(obj, handle)
        handle.truncate(10)  # a torn file, as a crash mid-write would leave
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", save_half_then_crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(tmp_path, {"epoch": 2})
    monkeypatch.undo()
    kept = checkpoint.load_latest_checkpoint(tmp_path)
    assert kept is not None and kept["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint.LATEST]


def trainer_state(epoch: int = 2) -> tuple[dict, SimpleNet, torch.optim.Optimizer]:
    """What the trainer's record_epoch saves: SimpleNet's weights and SGD's momentum after a step."""
    torch.manual_seed(0)
    model = SimpleNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    model(torch.randn(2, 1, 28, 28)).sum().backward()
    optimizer.step()
    state = {"epoch": epoch, "dataset": "digits", "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    return state, model, optimizer


def test_a_trainer_checkpoint_loads_weights_only_into_a_fresh_model(tmp_path):
    saved, model, optimizer = trainer_state()
    checkpoint.save_checkpoint(tmp_path, saved)
    state = checkpoint.load_latest_checkpoint(tmp_path)
    assert state is not None
    fresh = SimpleNet()
    fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.01, momentum=0.5)
    fresh.load_state_dict(state["model"])
    fresh_optimizer.load_state_dict(state["optimizer"])
    assert (state["epoch"], state["dataset"]) == (2, "digits")
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values(), strict=True))
    momentum = [fresh_optimizer.state[p]["momentum_buffer"] for p in fresh.parameters()]
    assert all(
        torch.equal(a, optimizer.state[p]["momentum_buffer"]) for a, p in zip(momentum, model.parameters(), strict=True)
    )


class RunsCode:
    """Unpickling this runs `touch MARKER`: what a planted checkpoint could do on rank 0."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(lambda marker: {"epoch": 1, "model": RunsCode(marker)}, id="code in the state"),
        pytest.param(lambda marker: RunsCode(marker), id="code as the whole file"),
        pytest.param(lambda marker: {"epoch": 1, "extra": Path("/etc")}, id="an object that runs nothing"),
    ],
)
def test_a_checkpoint_holding_objects_is_refused_in_one_line_and_nothing_runs(tmp_path, content):
    marker = tmp_path / "ran"
    folder = tmp_path / "checkpoints"
    checkpoint.save_checkpoint(folder, content(marker))
    with pytest.raises(checkpoint.CheckpointError) as refused:
        checkpoint.load_latest_checkpoint(folder)
    message = str(refused.value)
    assert "\n" not in message
    assert str(folder / checkpoint.LATEST) in message and "nothing in it was run" in message
    assert "--checkpoint-dir" in message  # the fix
    assert not marker.exists()


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"not a checkpoint", "Unsupported operand"),
        (b"", "cannot read checkpoint"),
        (b"PK\x03\x04 a zip cut short", "cannot read checkpoint"),
    ],
)
def test_a_file_that_is_no_checkpoint_is_one_line_naming_it(tmp_path, data, expected):
    (tmp_path / checkpoint.LATEST).write_bytes(data)
    with pytest.raises(checkpoint.CheckpointError) as refused:
        checkpoint.load_latest_checkpoint(tmp_path)
    message = str(refused.value)
    assert "\n" not in message and expected in message and str(tmp_path / checkpoint.LATEST) in message


def test_a_checkpoint_that_is_no_dict_is_refused(tmp_path):
    checkpoint.save_checkpoint(tmp_path, [1, 2])  # type: ignore[arg-type]
    with pytest.raises(checkpoint.CheckpointError, match="holds a list, not a dict"):
        checkpoint.load_latest_checkpoint(tmp_path)


@pytest.mark.parametrize(
    "message, reason",
    [
        (
            "Weights only load failed. In PyTorch 2.6, we changed ...\n\n\nTrying to load unsupported GLOBAL "
            "posix.system whose module posix is blocked.\n\nCheck the documentation of torch.load to learn more",
            "Trying to load unsupported GLOBAL posix.system whose module posix is blocked",
        ),
        (
            "Weights only load failed. ...\nPlease file an issue with the following so that we can make it "
            "compatible: WeightsUnpickler error: \n\nUnsupported operand 103\n\nCheck the documentation",
            "Unsupported operand 103",
        ),
        ("Weights only load failed.", "not a weights-only file"),
    ],
)
def test_the_refusal_names_what_torch_refused_not_its_advice(message, reason):
    assert checkpoint.unpickling_reason(message) == reason


def resuming_config(checkpoint_dir: Path) -> TrainConfig:
    return TrainConfig(checkpoint_dir=checkpoint_dir, dataset="digits", base_lr=0.1, momentum=0.0)


def torch_trainer(config: TrainConfig):
    """The PyTorch trainer's model and optimizer, built as the run builds them, before any training."""
    train_torch = pytest.importorskip("app.train_torch")  # imports horovod.torch
    trainer = train_torch.TorchTrainer(config)
    trainer.build()
    return trainer


def test_resuming_from_a_refused_checkpoint_is_the_trainers_one_line_problem(tmp_path):
    marker = tmp_path / "ran"
    checkpoint.save_checkpoint(tmp_path, {"epoch": 1, "dataset": "digits", "model": RunsCode(marker)})
    config = resuming_config(tmp_path)
    start_epoch, problem = train_loop.load_resume_point(config, torch_trainer(config))
    assert (
        start_epoch == 1
        and problem is not None
        and problem.startswith(f"refusing checkpoint {tmp_path / checkpoint.LATEST}")
    )
    assert not marker.exists()


def test_resuming_from_a_trainer_checkpoint_continues_after_its_epoch(tmp_path):
    saved, trained, _ = trainer_state(epoch=4)
    checkpoint.save_checkpoint(tmp_path, saved)
    config = resuming_config(tmp_path)
    trainer = torch_trainer(config)
    assert train_loop.load_resume_point(config, trainer) == (5, None)
    assert torch.equal(trainer.model.fc1.weight, trained.fc1.weight)


def test_tensorflow_checkpoints_round_trip_as_arrays_without_pickle(tmp_path):
    arrays: dict[str, list[np.ndarray]] = {
        "model": [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3)],
        "optimizer": [np.array(7)],
    }
    checkpoint.save_arrays(tmp_path, {"epoch": 3, "dataset": "digits"}, arrays)
    read_back = checkpoint.load_arrays(tmp_path)
    assert read_back is not None
    meta, loaded = read_back
    assert meta == {"epoch": 3, "dataset": "digits"}
    assert [a.tolist() for a in loaded["model"]] == [a.tolist() for a in arrays["model"]]
    assert loaded["optimizer"][0] == 7
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_tensorflow_checkpoint_that_holds_a_pickle_is_refused_in_one_line(tmp_path):
    np.savez(
        tmp_path / checkpoint.KERAS_LATEST,
        allow_pickle=True,
        meta=np.array('{"epoch": 1}'),
        **{"model/0": np.array([object()])},
    )
    with pytest.raises(checkpoint.CheckpointError, match=r"^cannot read checkpoint .*latest\.npz \(.*pickle"):
        checkpoint.load_arrays(tmp_path)


@pytest.mark.parametrize(
    ("present", "load", "other_image"),
    [
        (checkpoint.LATEST, checkpoint.load_arrays, "horovod-stack:latest"),
        (checkpoint.KERAS_LATEST, checkpoint.load_latest_checkpoint, "horovod-stack:tensorflow"),
    ],
)
def test_a_folder_of_the_other_frameworks_checkpoint_names_its_image(tmp_path, present, load, other_image):
    (tmp_path / present).write_bytes(b"whatever")
    with pytest.raises(checkpoint.CheckpointError, match=f"resume it on {other_image}"):
        load(tmp_path)
