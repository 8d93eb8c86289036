"""`launcher status`'s one line per job, from the containers' state and the job's records: table-driven."""

from datetime import UTC, datetime

import pytest

from launcher.core.jobend import JobEnd
from launcher.core.runs import RunState
from launcher.host.engines.node_engine import ContainerState
from launcher.host.running.jobstate import NO_METRICS, describe

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
RUNNING = ContainerState("node_1", running=True)
ENDED = ContainerState("node_1", running=False, exit_code=0, finished_at="2026-12-01T11:59:48.123456789Z")
KILLED = ContainerState("node_2", running=False, exit_code=137, finished_at="2026-12-01T11:58:00Z")
METRICS = (
    '{"epoch": 1, "epochs": 2, "train_loss": 0.9, "val_loss": 0.5, "val_accuracy": 0.81, "samples_per_sec": 6100.4}\n'
    '{"epoch": 2, "epochs": 2, "train_loss": 0.3, "val_loss": 0.2, "val_accuracy": 0.93251, '
    '"samples_per_sec": 6499.6}\n'
)
RANK_FAILED = JobEnd(
    1, "rank 1 on node_2: RuntimeError: user script failed on purpose on rank 1", state=RunState.FAILED, failed_rank=1
)


@pytest.mark.parametrize(
    "rank0, job_status, workers, metrics, expected",
    [
        (RUNNING, None, [], "", "running: no epoch finished yet"),
        (RUNNING, None, [], None, f"running: {NO_METRICS}"),  # a script of the user's: no metrics file
        (RUNNING, None, [], METRICS, "running: epoch 2 of 2, val accuracy 0.9325, 6500 samples/s"),
        (
            ENDED,
            JobEnd(0).to_json(),
            [],
            METRICS,
            "succeeded (exit status 0): epoch 2 of 2, val accuracy 0.9325, 6500 samples/s, ended 12 s ago",
        ),
        (ENDED, JobEnd(0).to_json(), [], None, f"succeeded (exit status 0): {NO_METRICS}, ended 12 s ago"),
        # the agent's cause: the failed rank's record, rendered as it came
        (
            ENDED,
            RANK_FAILED.to_json(),
            [],
            METRICS,
            "failed (exit status 1): rank 1 on node_2: RuntimeError: user script failed on purpose on rank 1, "
            "ended 12 s ago",
        ),
        (ENDED, RANK_FAILED.to_json(), [KILLED], None, "failed (exit status 1): rank 1 on node_2: RuntimeError: "
         "user script failed on purpose on rank 1, ended 12 s ago"),  # the agent's cause stands
        # no cause recorded: a worker's container killed is read from its state
        (
            ENDED,
            JobEnd(1).to_json(),
            [KILLED],
            None,
            "failed (exit status 1): node_2: its worker container was killed, ended 12 s ago",
        ),
        (ENDED, JobEnd(1).to_json(), [], None, "failed (exit status 1), ended 12 s ago"),
        (
            ENDED,
            JobEnd(
                2, "node_2: cannot start `python t.py` in /workdir: script t.py is not there; pass --workdir"
            ).to_json(),
            [],
            None,
            "failed (exit status 2): node_2: cannot start `python t.py` in /workdir: script t.py is not there; pass "
            "--workdir, ended 12 s ago",
        ),
        (
            ContainerState("node_1", running=False, exit_code=137, finished_at="2026-12-01T11:50:00Z"),
            None,
            [],
            METRICS,
            "failed: rank 0's container stopped (exit status 137) before the job ended, ended 10 min 0 s ago",
        ),
    ],
)  # fmt: skip
def test_job_state_line(rank0, job_status, workers, metrics, expected):
    assert describe(rank0, job_status, workers, now=NOW, metrics=metrics) == expected


@pytest.mark.parametrize(
    "metrics, expected",
    [
        (METRICS + '{"epoch": 3, "train_lo', "epoch 2 of 2, val accuracy 0.9325, 6500 samples/s"),  # being written
        # a metrics file from before the planned epochs were recorded
        ('{"epoch": 2, "val_accuracy": 0.93251, "samples_per_sec": 6499.6}\n', "epoch 2, val accuracy 0.9325, 6500 "
         "samples/s"),
        ("not json\n", "no epoch finished yet"),
    ],
)  # fmt: skip
def test_the_progress_is_the_metrics_files_last_record(metrics, expected):
    assert describe(RUNNING, None, [], now=NOW, metrics=metrics) == f"running: {expected}"
