"""A rank's error as a record (app/rank_error.py): written and read back, malformed lines refused, the first real
cause picked; the job agent's cause from the records in the job's output (launcher/agent/rank_errors.py, job.py)."""

from __future__ import annotations

import io
import json
import sys

import pytest

from app import frameworks, rank_error
from app.rank_error import MARKER, RankError, first_cause, of_exception
from launcher.agent.job import Agent
from launcher.agent.rank_errors import RankErrors, node_of
from launcher.core.jobend import JobEnd, parse_job_end
from launcher.core.jobspec import Worker
from launcher.core.protocol import JOB_STATUS
from launcher.core.runs import RunState
from tests.conftest import job_spec
from tests.standins import Clock
from tests.standins import StandInTransport as Transport

FAILED = RankError(1, "node-2", "RuntimeError", "user script failed on purpose on rank 1")
SHUT_DOWN = RankError(
    0, "node-1", "HorovodInternalError", "ops.cc: Horovod has been shut down. This was caused by an exception"
)


@pytest.mark.parametrize(
    "record",
    [
        FAILED,
        SHUT_DOWN,
        RankError(0, "", "KeyboardInterrupt", ""),
        RankError(12, "gpu1.lab", "ValueError", 'quotes " and \\ and unicode é'),
    ],
)
def test_a_record_reads_back_as_written_on_one_line(record):
    line = record.to_line()
    assert line.startswith(MARKER) and "\n" not in line
    assert RankError.from_line(line) == record
    assert RankError.from_line(line + "\r\n") == record  # as a line of output comes


def record_line(**fields: object) -> str:
    return MARKER + json.dumps({"rank": 1, "node": "n", "kind": "RuntimeError", "message": "m", **fields})


@pytest.mark.parametrize(
    "line",
    [
        "",
        "RuntimeError: user script failed on purpose on rank 1",
        MARKER,
        MARKER + "{",
        MARKER + "[1, 2]",
        MARKER + '{"rank": 1}',
        record_line(rank="1"),
        record_line(rank=-1),
        record_line(rank=True),
        record_line(rank=1.0),
        record_line(node=None),
        record_line(kind=""),
        record_line(kind=3),
        record_line(message=["m"]),
        record_line(message="two\nlines"),
        record_line(message="x" * (rank_error.MESSAGE_LIMIT + 1)),
        record_line(extra="field"),
        record_line(node="n" * rank_error.LINE_LIMIT),
        "rank 1 said " + record_line(),  # a marker inside another line is no record
    ],
)
def test_anything_but_a_well_formed_record_is_none(line):
    assert RankError.from_line(line) is None


@pytest.mark.parametrize(
    "environ, error, expected",
    [
        ({"OMPI_COMM_WORLD_RANK": "1"}, RuntimeError("boom\nsecond line"),
         RankError(1, "host", "RuntimeError", "boom")),
        ({"HOROVOD_RANK": "3", "OMPI_COMM_WORLD_RANK": "0", "HOROVOD_HOSTNAME": "10.0.0.2"}, KeyError("k"),
         RankError(3, "10.0.0.2", "KeyError", "'k'")),
        ({"PMIX_RANK": "2"}, ValueError(), RankError(2, "host", "ValueError", "")),
        ({"PMIX_RANK": "2"}, ValueError("x" * 1000),
         RankError(2, "host", "ValueError", "x" * rank_error.MESSAGE_LIMIT)),
        ({}, RuntimeError("not a rank"), None),
        ({"OMPI_COMM_WORLD_RANK": "one"}, RuntimeError("no number"), None),
    ],
)  # fmt: skip
def test_the_record_of_an_exception_on_a_rank(environ, error, expected):
    made = of_exception(error, environ, lambda: "host")
    assert made == expected
    assert made is None or RankError.from_line(made.to_line()) == made


@pytest.mark.parametrize(
    "records, expected",
    [
        ([], None),
        ([FAILED], FAILED),
        ([SHUT_DOWN, FAILED], FAILED),  # Horovod's shut-down on rank 0 came first: rank 1's error is the cause
        ([SHUT_DOWN], SHUT_DOWN),  # nothing else said: it is all there is
        ([FAILED, RankError(0, "n", "RuntimeError", "later")], FAILED),
    ],
)
def test_the_first_real_cause(records, expected):
    assert first_cause(records) == expected


def test_the_images_hook_writes_the_record_after_the_traceback_only_where_the_job_asks(monkeypatch):
    said = io.StringIO()
    monkeypatch.setattr(sys, "stderr", said)
    monkeypatch.setattr(sys, "excepthook", lambda kind, error, trace: print(f"{kind.__name__}: {error}", file=said))
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.delenv(rank_error.VARIABLE, raising=False)
    rank_error.install()
    sys.excepthook(RuntimeError, RuntimeError("boom"), None)
    assert said.getvalue() == "RuntimeError: boom\n"  # not asked for: no record
    monkeypatch.setenv(rank_error.VARIABLE, "1")
    sys.excepthook(RuntimeError, RuntimeError("boom"), None)
    lines = said.getvalue().splitlines()
    assert lines[-2] == "RuntimeError: boom"
    assert RankError.from_line(lines[-1]) == RankError(1, rank_error.socket.gethostname(), "RuntimeError", "boom")


# --- the job agent --------------------------------------------------------------------------------------------------
W1, W2 = Worker("node_1", "10.0.0.1", 2), Worker("node_2", "10.0.0.2", 2)


@pytest.mark.parametrize(
    "rank, record_node, slots, expected",
    [
        (0, "x", [2, 2], "node_1"),
        (3, "x", [2, 2], "node_2"),  # mpirun's -map-by slot: node_1 runs 0-1, node_2 2-3
        (2, "x", [1, 1], "x"),  # past the placement: the host it names
        (5, "10.0.0.2", None, "node_2"),  # elastic: horovodrun's host, the worker's address
        (5, "node-9", None, "node-9"),
    ],
)
def test_the_node_a_rank_ran_on(rank, record_node, slots, expected):
    assert node_of(record_node, rank, [W1, W2], slots) == expected


def test_the_records_in_the_jobs_output_are_taken_out_of_it_and_the_first_real_one_kept():
    errors = RankErrors()
    assert not errors.feed("[1,2]<stderr>:Traceback (most recent call last):\n")
    assert errors.feed(f"[1,0]<stderr>:{SHUT_DOWN.to_line()}\n")
    assert errors.feed(f"[1]<stderr>:{FAILED.to_line()}\n")  # elastic horovodrun's tag
    assert not errors.feed(f"[1,1]<stdout>:{MARKER}not json\n")
    assert errors.cause() == FAILED


def test_a_failed_ranks_record_is_the_jobs_cause_with_its_node():
    clock = Clock()
    output = (
        "[1,3]<stderr>:Traceback (most recent call last):",
        "[1,3]<stderr>:RuntimeError: user script failed on purpose on rank 3",
        f"[1,0]<stderr>:{SHUT_DOWN.to_line()}",
        f"[1,3]<stderr>:{RankError(3, 'node-2', 'RuntimeError', 'user script failed on purpose on rank 3').to_line()}",
    )
    transport = Transport(clock, up_from={W1.address: 0, W2.address: 0}, status=1, output=output)
    job = job_spec(job_id="j1", command=("python", "t.py"), expected_workers=2, workers=(W1, W2), ready_timeout=5)
    said: list[str] = []
    end = Agent(job, transport, say=said.append, clock=clock, sleep=clock.sleep).run()
    cause = "rank 3 on node_2: RuntimeError: user script failed on purpose on rank 3"
    assert end == JobEnd(1, cause, state=RunState.FAILED, failed_rank=3) == parse_job_end(transport.files[JOB_STATUS])
    assert f"error: {cause}" in said


def test_a_failed_run_without_a_record_has_no_rank_cause():
    clock = Clock()
    output = ("[1,1]<stderr>:RuntimeError: a line of prose is no record",)
    transport = Transport(clock, up_from={W1.address: 0, W2.address: 0}, status=1, output=output)
    job = job_spec(job_id="j1", command=("python", "t.py"), expected_workers=2, workers=(W1, W2), ready_timeout=5)
    end = Agent(job, transport, say=lambda _: None, clock=clock, sleep=clock.sleep).run()
    assert end == JobEnd(1, state=RunState.FAILED)


def test_the_wrong_images_one_line_is_the_records_message(monkeypatch):
    """A script that imports the other image's framework ends in the hint's one line (app/frameworks.py), not a
    traceback: its record says that line, which names the fix."""
    said = io.StringIO()
    monkeypatch.setattr(sys, "stderr", said)
    monkeypatch.setattr(sys, "excepthook", frameworks.excepthook)
    monkeypatch.setattr(frameworks, "installed", lambda: frameworks.PYTORCH)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv(rank_error.VARIABLE, "1")
    rank_error.install()
    error = ModuleNotFoundError("No module named 'tensorflow'", name="tensorflow")
    sys.excepthook(ModuleNotFoundError, error, None)
    hint, record = said.getvalue().splitlines()
    assert hint.startswith("error: this script imports tensorflow (TensorFlow), which horovod-stack:latest")
    made = RankError.from_line(record)
    assert made is not None and made.kind == "ModuleNotFoundError"
    assert made.message == hint.removeprefix("error: ")


@pytest.mark.parametrize(
    "kind, message, expected",
    [
        ("RuntimeError", "boom", ("RuntimeError", "boom")),
        ("RuntimeError", "", ("RuntimeError", "")),
        ("RuntimeError", "  boom  \n\n", ("RuntimeError", "boom")),
        (  # torch's DataLoader re-raises a worker's error with its traceback in the message
            "RuntimeError",
            "Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
            '  File "collate.py", line 273, in collate_tensor_fn\n'
            "RuntimeError: unable to allocate shared memory(shm) for file </torch_1>: No space left on device (28)\n",
            ("RuntimeError", "unable to allocate shared memory(shm) for file </torch_1>: No space left on device (28)"),
        ),
        (  # a tf.function's error: "in user code:", the frames, the original error last
            "TypeError",
            'in user code:\n\n    File "keras2_tape.py", line 30, in step  *\n'
            "        grads = tape.gradient(loss, opt.variables())\n\n    TypeError: 'list' object is not callable\n",
            ("TypeError", "'list' object is not callable"),
        ),
        (
            "tensorflow.python.framework.errors_impl.InternalError",
            "a\nerrors_impl.InternalError: b",
            ("InternalError", "b"),
        ),
        ("ValueError", "first\nsecond, no kind", ("ValueError", "first")),
    ],
)
def test_an_exceptions_telling_line(kind, message, expected):
    assert rank_error.telling(kind, message) == expected
