"""The Slurm batch script's stall watch in the SIF (launcher/agent/batch_stall.py): when a stall counts (the output's
and the metrics file's times, one report per stall), the wait against a stand-in clock, and the report of what every
node's `stacks collect` printed. The script around it: tests/test_sbatch.py; a live cluster: test_slurm_cluster.py.
"""

from __future__ import annotations

import os

import pytest

from launcher.agent import batch_stall, stacks
from launcher.agent.stacks import Frame, RankStack

NOW, TIMEOUT = 1000.0, 20
NEVER = batch_stall.NOT_THERE


@pytest.mark.parametrize(
    "output, metrics, after, stalled",
    [
        (NOW - 25, None, 0, 25),  # a script of the user's: its output alone
        (NOW - 10, None, 0, None),
        (NOW - 25, NOW - 5, 0, None),  # new metrics are progress: the trainer prints nothing between epochs
        (NOW - 30, NOW - 21, 0, 21),
        (NOW - 25, NEVER, 0, 25),  # no metrics yet: the output alone
        (NOW - 25, None, NOW - 25, None),  # reported at NOW - 25 and nothing since: the same stall
        (NOW - 25, NOW - 30, NOW - 26, 25),  # output after the last report: a new stall
    ],
)
def test_a_stall_counts_once_the_output_and_metrics_are_older_than_the_timeout_and_once_per_stall(
    output, metrics, after, stalled
):
    assert batch_stall.new_stall(NOW, output, metrics, TIMEOUT, after) == stalled


def test_wait_returns_the_idle_seconds_of_a_stall_or_none_once_the_ranks_ended(tmp_path):
    clock = iter(range(100, 200, 5))
    slept: list[float] = []
    idle = batch_stall.wait(
        os.getpid(), TIMEOUT, None, 0.0, output_mtime=lambda: 100.0, clock=lambda: next(clock), sleep=slept.append
    )
    assert idle == 20 and slept == [5, 5, 5, 5]
    assert batch_stall.wait(2**22 + 1, TIMEOUT, str(tmp_path / "none.jsonl"), 0.0, output_mtime=lambda: 0.0) is None
    assert batch_stall.mtime(str(tmp_path / "none.jsonl")) == NEVER and batch_stall.mtime(None) is None


HUNG = RankStack(
    1, "node2", 88, (Frame("wait_forever", "/workdir/hang.py", 7), Frame("<module>", "/workdir/hang.py", 12))
)
WAITING = RankStack(
    0, "node1", 77, (Frame("synchronize", "/opt/venv/lib/python3.11/site-packages/horovod/torch/mpi_ops.py", 1037),)
)


def test_the_report_groups_every_nodes_ranks_as_launcher_stacks_does_and_fail_names_the_stall():
    lines = [stacks.to_json([WAITING]) + "\n", "INFO: a line of Apptainer's\n", stacks.to_json([HUNG]) + "\n"]
    found = batch_stall.collected(lines)
    assert found == [WAITING, HUNG]
    assert batch_stall.report(found, TIMEOUT, fail=False) == stacks.report(found)
    failed = batch_stall.report(found, TIMEOUT, fail=True).splitlines()[-1]
    assert failed == (
        "error: the job stalled: no output and no new metrics for 20 s; rank 1 (node2 pid 88) in wait_forever at "
        "hang.py:7 while rank 0 in synchronize at mpi_ops.py:1037; ending the job (stall action fail)"
    )
    assert batch_stall.report([], TIMEOUT, fail=True).splitlines() == [
        "no rank process found (is a job running?)",
        "error: the job stalled: no output and no new metrics for 20 s; no stacks; ending the job (stall action fail)",
    ]
