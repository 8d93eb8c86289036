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


def test_a_last_line_cut_short_is_left_out_of_the_records(tmp_path):
    path = tmp_path / "metrics.jsonl"
    metrics.append_record(path, {field: 1 for field in metrics.FIELDS})
    with open(path, "a") as handle:
        handle.write('{"epoch": 2, "train_lo')
    assert [record["epoch"] for record in metrics.read_records(path)] == [1]
    path.write_text('{"epoch": 1\n{"epoch": 2}\n')
    with pytest.raises(ValueError, match="line 1"):
        metrics.read_records(path)
