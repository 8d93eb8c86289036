import json

import pytest

from app import metrics


def test_resume_keeps_only_epochs_covered_by_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    for epoch in (1, 2, 3):
        metrics.append_record(path, {field: epoch for field in metrics.FIELDS})
    metrics.keep_epochs_up_to(path, 2)
    assert [json.loads(line)["epoch"] for line in path.read_text().splitlines()] == [1, 2]
    metrics.keep_epochs_up_to(path, 0)
    assert path.read_text() == ""


def test_record_must_be_complete(tmp_path):
    with pytest.raises(ValueError, match="val_accuracy"):
        metrics.append_record(tmp_path / "m.jsonl", {"epoch": 1})
