"""app/shared_values.py: what ranks hand each other crosses as JSON in byte tensors, never as a pickle. The exchange
with a stand-in allgather (3 ranks' arrays concatenated, as Horovod's allgather returns them); the trainers and the
benches on real ranks: tests/test_train_integration.py, tests/test_tensorflow.py, tests/test_bench.py."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

from tests.extras import skip_module_without

skip_module_without("numpy")

import numpy as np  # noqa: E402

from app import shared_values  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def ranks_gather(values_by_rank: list):
    """An allgather over len(values_by_rank) ranks, each calling it with its own value in turn: this rank's
    array is the one given; the others' come from encoding their values the same way."""
    calls: list[str] = []

    def run(rank: int):
        def gather(array: np.ndarray, name: str) -> np.ndarray:
            calls.append(name)
            if name.endswith(".lengths"):
                found = [np.array([len(shared_values.encode(value))], dtype=np.int64) for value in values_by_rank]
            else:
                longest = max(len(shared_values.encode(value)) for value in values_by_rank)
                found = [shared_values.padded(shared_values.encode(value), longest) for value in values_by_rank]
            found[rank] = array
            assert all(len(part) == len(array) for part in found), "every rank's array has the same length"
            return np.concatenate(found)

        return gather

    return run, calls


@pytest.mark.parametrize(
    "values",
    [
        [{"rank": 0, "host": "node_1", "digest": "ab" * 32}, {"rank": 1, "host": "nöde-2", "digest": "cd" * 32}],
        [[1, None], [1, None], [1, "the checkpoint was trained on 'mnist'"]],
        [[0.5, 0.25], [0.125], []],
        [None],
    ],
)
def test_every_rank_gets_every_ranks_value_in_rank_order(values):
    run, calls = ranks_gather(values)
    for rank, value in enumerate(values):
        assert shared_values.allgather(value, run(rank), "x") == values
    assert set(calls) == {"x", "x.lengths"}


def test_broadcast_gives_the_root_ranks_value_tuples_as_lists():
    values = [(3, None), (1, "not me")]
    run, _ = ranks_gather(values)
    assert shared_values.broadcast(values[1], 0, run(1), "resume_point") == [3, None]
    first, problem = shared_values.broadcast(values[0], 0, run(0), "resume_point")
    assert (first, problem) == (3, None)


class RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_pickle_from_another_rank_is_bytes_that_decode_to_nothing(tmp_path):
    """What a stranger could hand a rank through the collective: a code-running pickle, in the gathered bytes. The
    decoder reads JSON, so it fails to parse and runs nothing."""
    marker = tmp_path / "ran"
    payload = np.frombuffer(pickle.dumps(RunsCode(marker)), dtype=np.uint8)
    with pytest.raises(ValueError):
        shared_values.decoded(payload.reshape(1, -1), [len(payload)])
    assert not marker.exists()


PICKLING_COLLECTIVES = re.compile(r"\b(allgather_object|broadcast_object|all_gather_object|broadcast_object_list|"
                                  r"gather_object|scatter_object_list|pickle\.loads?|cloudpickle)\b")  # fmt: skip


def test_no_rank_code_unpickles_what_other_ranks_send():
    """The trainers and benches (app/) call no collective that pickles, and unpickle nothing."""
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted((REPO / "app").rglob("*.py"))
        if path.name != "shared_values.py"  # its docstring names them
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PICKLING_COLLECTIVES.search(line)
    ]
    assert found == []
