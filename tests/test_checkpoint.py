"""A checkpoint write cut short leaves the previous checkpoint readable and no debris."""

import pytest
import torch

from app import checkpoint


def test_round_trip(tmp_path):
    checkpoint.save_checkpoint(tmp_path, {"epoch": 3, "weights": torch.arange(4)})
    state = checkpoint.load_latest_checkpoint(tmp_path)
    assert state["epoch"] == 3 and torch.equal(state["weights"], torch.arange(4))


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
    assert checkpoint.load_latest_checkpoint(tmp_path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint.LATEST]

