"""`launcher status`'s one line per job, from the containers' state and the job's files: table-driven."""

from datetime import UTC, datetime

import pytest

from launcher.core.jobend import JobEnd
from launcher.host.engines.node_engine import ContainerState
from launcher.host.running.jobstate import describe

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
LOG = (
    "12:00 [rank 0] epoch 1/2: train loss 0.9, val loss 0.5, val accuracy 0.8100, 6100 samples/s, 0.3 s\n"
    "12:00 [rank 0] epoch 2/2: train loss 0.3, val loss 0.2, val accuracy 0.9325, 6500 samples/s, 0.3 s\n"
)
TRACEBACK = (
    'Traceback (most recent call last):\n  File "train.py", line 3\n'
    "RuntimeError: user script failed on purpose on rank 1\n"
    "horovod.common.exceptions.HorovodInternalError: ops.cc: Horovod has been shut down. This was caused "
    "by an exception on one of the ranks\n"
    "Primary job  terminated normally, but 1 process returned\n"
)
TAGGED = (
    "".join(
        f"[1,{rank}]<{stream}>:{line}\n"
        for rank, stream, line in [  # mpirun --tag-output
            (
                0,
                "stderr",
                "12:00 [rank 0] epoch 1/2: train loss 0.9, val loss 0.5, val accuracy 0.8100, 6100 samples/s, 0.3 s",
            ),
            (1, "stderr", "Traceback (most recent call last):"),
            (1, "stderr", "RuntimeError: user script failed on purpose"),
            (0, "stderr", "horovod.common.exceptions.HorovodInternalError: ops.cc: Horovod has been shut down."),
        ]
    )
    + "Primary job  terminated normally, but 1 process returned\n"
)
RUNNING = ContainerState("node_1", running=True)
ENDED = ContainerState("node_1", running=False, exit_code=0, finished_at="2026-12-01T11:59:48.123456789Z")
KILLED = ContainerState("node_2", running=False, exit_code=137, finished_at="2026-12-01T11:58:00Z")
METRICS = (
    '{"epoch": 1, "train_loss": 0.9, "val_loss": 0.5, "val_accuracy": 0.81, "samples_per_sec": 6100.4}\n'
    '{"epoch": 2, "train_loss": 0.3, "val_loss": 0.2, "val_accuracy": 0.93251, "samples_per_sec": 6499.6}\n'
)


@pytest.mark.parametrize(
    "rank0, job_status, log, workers, expected",
    [
        (RUNNING, None, "", [], "running: no epoch finished yet"),
        (RUNNING, None, LOG, [], "running: epoch 2 of 2, val accuracy 0.9325, 6500 samples/s"),
        (
            ENDED,
            JobEnd(0).to_json(),
            LOG,
            [],
            "succeeded (exit status 0): epoch 2 of 2, val accuracy 0.9325, 6500 samples/s, ended 12 s ago",
        ),
        (
            ENDED,
            JobEnd(1).to_json(),
            LOG + TRACEBACK,
            [],
            "failed (exit status 1): RuntimeError: user script failed on purpose on rank 1, ended 12 s ago",
        ),
        (
            ENDED,
            JobEnd(1).to_json(),
            LOG,
            [KILLED],
            "failed (exit status 1): node_2: its worker container was killed, ended 12 s ago",
        ),
        (
            ENDED,
            JobEnd(2).to_json(),
            "error: --epochs must be at least 1 (got 0)\n",
            [],
            "failed (exit status 2): error: --epochs must be at least 1 (got 0), ended 12 s ago",
        ),
        # the job agent's message: the status, and its root cause where it named one
        (
            ENDED,
            JobEnd(0).to_json(),
            LOG,
            [],
            "succeeded (exit status 0): epoch 2 of 2, val accuracy 0.9325, 6500 samples/s, ended 12 s ago",
        ),
        (
            ENDED,
            JobEnd(1).to_json(),
            LOG + TRACEBACK,
            [],
            "failed (exit status 1): RuntimeError: user script failed on purpose on rank 1, ended 12 s ago",
        ),
        (
            ENDED,
            JobEnd(
                2, "node_2: cannot start `python t.py` in /workdir: script t.py is not there; pass --workdir"
            ).to_json(),
            LOG,
            [],
            "failed (exit status 2): node_2: cannot start `python t.py` in /workdir: script t.py is not there; pass "
            "--workdir, ended 12 s ago",
        ),
        # each rank's lines tagged with it (mpirun --tag-output): read as the rank wrote them
        (RUNNING, None, TAGGED, [], "running: epoch 1 of 2, val accuracy 0.8100, 6100 samples/s"),
        (
            ENDED,
            JobEnd(1).to_json(),
            TAGGED,
            [],
            "failed (exit status 1): RuntimeError: user script failed on purpose, ended 12 s ago",
        ),
        (
            ENDED,
            JobEnd(1).to_json(),
            "[1]<stderr>:error: --epochs must be at least 1 (got 0)\n",
            [],
            "failed (exit status 1): error: --epochs must be at least 1 (got 0), ended 12 s ago",
        ),  # elastic horovodrun
        (
            ContainerState("node_1", running=False, exit_code=137, finished_at="2026-12-01T11:50:00Z"),
            None,
            LOG,
            [],
            "failed: rank 0's container stopped (exit status 137) before the job ended, ended 10 min 0 s ago",
        ),
    ],
)
def test_job_state_line(rank0, job_status, log, workers, expected):
    assert describe(rank0, job_status, log, workers, now=NOW) == expected


@pytest.mark.parametrize(
    "rank0, job_status, log, metrics, expected",
    [
        # the metrics file is read first; the log's epoch line still gives the planned epochs
        (RUNNING, None, LOG.splitlines()[0], METRICS, "running: epoch 2 of 2, val accuracy 0.9325, 6500 samples/s"),
        (RUNNING, None, "", METRICS, "running: epoch 2, val accuracy 0.9325, 6500 samples/s"),
        (
            RUNNING,
            None,
            "",
            METRICS + '{"epoch": 3, "train_lo',
            "running: epoch 2, val accuracy 0.9325, 6500 samples/s",
        ),
        (RUNNING, None, LOG, "", "running: epoch 2 of 2, val accuracy 0.9325, 6500 samples/s"),
        (RUNNING, None, "", None, "running: no epoch finished yet"),
        (
            ENDED,
            JobEnd(0).to_json(),
            "",
            METRICS,
            "succeeded (exit status 0): epoch 2, val accuracy 0.9325, 6500 samples/s, ended 12 s ago",
        ),
    ],
)
def test_job_state_line_from_the_metrics_file(rank0, job_status, log, metrics, expected):
    assert describe(rank0, job_status, log, [], now=NOW, metrics=metrics) == expected
