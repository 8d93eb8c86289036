"""The smoke role's pure parts (launcher/smoke/): horovodrun's lines, the verdict and last line, the exit status,
the JUnit report, the bundled trainer's checks, faulthandler's stacks and the command line. The role run for real
in a container of the image: tests/test_smoke.py."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from app.rank_error import RankError
from launcher.smoke import access, hang, report, run, shm, trainer
from launcher.smoke.__main__ import parse_options
from launcher.smoke.output import JobLog, Line, last_error_line, parse, rank_exit, shown_driver_traceback


@pytest.mark.parametrize(
    "raw, rank, stream, text, shown",
    [
        ("[0]<stdout>:hello\n", 0, "stdout", "hello", "[rank 0] hello"),
        ("[12]<stderr>:  File \"x.py\", line 3\n", 12, "stderr", '  File "x.py", line 3',
         '[rank 12]   File "x.py", line 3'),
        ("[1]<stdout>:\n", 1, "stdout", "", "[rank 1] "),
        ("Process 1 exit with status code 1.\n", None, "stdout", "Process 1 exit with status code 1.",
         "[horovodrun] Process 1 exit with status code 1."),
        ("[1,0]<stdout>:mpirun's tag reads alike", 0, "stdout", "mpirun's tag reads alike",
         "[rank 0] mpirun's tag reads alike"),  # one reader of the rank tag: launcher/core/ranktag.py
        ("[x]<stdout>:no rank", None, "stdout", "[x]<stdout>:no rank", "[horovodrun] [x]<stdout>:no rank"),
    ],
)  # fmt: skip
def test_lines_are_parsed_and_shown_with_their_rank(raw, rank, stream, text, shown):
    line = parse(raw)
    assert (line.rank, line.stream, line.text, line.shown()) == (rank, stream, text, shown)


@pytest.mark.parametrize(
    "text, found",
    [
        ("Process 1 exit with status code 1.", (1, 1)),
        ("Process 10 exit with status code 143.", (10, 143)),
        ("Process 0 exit with status code -9.", (0, -9)),
        ("Process 1 exit with status code 1", None),
        ("Terminating remaining workers after failure of Process 1.", None),
    ],
)
def test_rank_exits(text, found):
    assert rank_exit(parse(text)) == found
    assert rank_exit(Line(0, "stdout", text)) is None  # a rank printing it is not horovodrun


def err(text: str) -> Line:
    return Line(1, "stderr", text)


def out(text: str) -> Line:
    return Line(1, "stdout", text)


@pytest.mark.parametrize(
    "lines, expected",
    [
        ([err("Traceback (most recent call last):"), err('  File "t.py", line 2'), err("RuntimeError: boom"),
          err("[2026-12-02 10:00:00.000000: W horovod/common/operations.cc:1] shutting down")], "RuntimeError: boom"),
        ([err("torch.cuda.OutOfMemoryError: CUDA out of memory")], "torch.cuda.OutOfMemoryError: CUDA out of memory"),
        ([out("error: --epochs must be at least 1"), out("")], "error: --epochs must be at least 1"),
        ([err("SystemExit: 3")], "SystemExit: 3"),
        ([err("KeyboardInterrupt")], "KeyboardInterrupt"),
        ([out("step 1"), err("warning: slow"), out("step 2")], "warning: slow"),
        ([out("step 1"), out("")], "step 1"),
        ([], None),
    ],
)  # fmt: skip
def test_a_ranks_last_error_line(lines, expected):
    assert last_error_line(lines) == expected


def test_horovodruns_traceback_is_left_out_only_when_it_repeats_a_rank_failure():
    repeats = [parse("Traceback (most recent call last):"), parse("RuntimeError: Horovod detected that one or more "
               "processes exited with non-zero status, thus causing the job to be terminated.")]  # fmt: skip
    own = [parse("Traceback (most recent call last):"), parse("ValueError: Invalid host input")]
    assert shown_driver_traceback(repeats) == []
    assert shown_driver_traceback(own) == ["[horovodrun] Traceback (most recent call last):",
                                           "[horovodrun] ValueError: Invalid host input"]  # fmt: skip


def test_a_ranks_record_is_taken_in_and_not_shown_as_output():
    log = JobLog(2)
    assert log.add(parse(f"[1]<stderr>:{SHUT_DOWN.to_line()}"))
    assert not log.add(parse(f"{SHUT_DOWN.to_line()}"))  # horovodrun's own line: not a rank's record
    assert not log.add(parse("[1]<stderr>:RuntimeError: boom"))
    assert log.ranks[1].record == SHUT_DOWN and [line.text for line in log.ranks[1].tail] == ["RuntimeError: boom"]


def job_log(size: int, *raw: str) -> JobLog:
    log = JobLog(size)
    for line in raw:
        log.add(parse(line))
    return log


RAISED = (
    "[0]<stdout>:rank 0 started", "[1]<stdout>:rank 1 started", "[1]<stderr>:Traceback (most recent call last):",
    "[1]<stderr>:RuntimeError: boom", "Process 1 exit with status code 1.", "[0]<stderr>:Terminated",
    "Process 0 exit with status code 143.",
)  # fmt: skip


RACE = (
    "[1]<stderr>:Traceback (most recent call last):", "[1]<stderr>:RuntimeError: boom",
    "[0]<stderr>:Traceback (most recent call last):",
    "[0]<stderr>:horovod.common.exceptions.HorovodInternalError: Horovod has been shut down.",
    "Process 0 exit with status code 1.", "Terminating remaining workers after failure of Process 0.",
    "[1]<stderr>:Terminated", "Process 1 exit with status code 143.",
)  # fmt: skip
"""Rank 1 raised; Horovod's shutdown made rank 0 fail and exit before rank 1 did, and horovodrun ended rank 1."""
RACE_UNTOLD = RACE[:-1]
"""The same, where horovodrun ended rank 1 without a line saying how it exited (seen in a full run)."""
SHUT_DOWN = RankError(0, "h", "HorovodInternalError", "ops.cc: Horovod has been shut down. This was caused by ...")
RECORDED = (
    "[0]<stderr>:Traceback (most recent call last):", f"[0]<stderr>:{SHUT_DOWN.to_line()}",
    "[1]<stderr>:Traceback (most recent call last):", "[1]<stderr>:RuntimeError: boom",
    f"[1]<stderr>:{RankError(1, 'h', 'RuntimeError', 'boom, in the record').to_line()}",
    "Process 0 exit with status code 1.", "[1]<stderr>:Terminated", "Process 1 exit with status code 143.",
)  # fmt: skip
"""Rank 0's Horovod shut down and said so first; rank 1's own error is the cause, in its record's words."""


@pytest.mark.parametrize(
    "log, returncode, extra, line, status",
    [
        (job_log(2, "[0]<stdout>:ok", "[1]<stdout>:ok"), 0, {}, "smoke: passed: 2 ranks over Gloo in 41 s", 0),
        (job_log(1, "[0]<stdout>:ok"), 0, {}, "smoke: passed: 1 rank over Gloo in 41 s", 0),
        (job_log(2, *RAISED), 1, {}, "smoke: failed: rank 1 exited with status 1: RuntimeError: boom", 1),
        (job_log(2, *RACE), 1, {}, "smoke: failed: rank 1 failed first: RuntimeError: boom", 1),
        (job_log(2, *RACE_UNTOLD), 1, {}, "smoke: failed: rank 1 failed first: RuntimeError: boom", 1),
        (job_log(2, *RECORDED), 1, {}, "smoke: failed: rank 1 failed first: RuntimeError: boom, in the record", 1),
        (job_log(2, f"[0]<stderr>:{SHUT_DOWN.to_line()}", "Process 0 exit with status code 1."), 1, {},
         f"smoke: failed: rank 0 exited with status 1: HorovodInternalError: {SHUT_DOWN.message}", 1),
        (job_log(2, "[1]<stderr>:Killed", "Process 1 exit with status code 137."), 1, {},
         "smoke: failed: rank 1 exited with status 137: Killed", 137),
        (job_log(2, "Process 0 exit with status code -9."), 1, {},
         "smoke: failed: rank 0 was killed by signal 9 (SIGKILL)", 137),
        (job_log(2, "[0]<stdout>:x", "Process 0 exit with status code 300."), 1, {},
         "smoke: failed: rank 0 exited with status 300: x", 1),
        (job_log(2, "Traceback (most recent call last):", "ValueError: Invalid host input"), 1, {},
         "smoke: failed: horovodrun exited with status 1: ValueError: Invalid host input", 1),
        (job_log(2, "[0]<stdout>:ok"), 0, {"check": "the bundled trainer did not learn"},
         "smoke: failed: the bundled trainer did not learn", 1),
        (job_log(2, "[0]<stdout>:a", "Process 0 exit with status code 134."), 1,
         {"timeout": 20, "where": "rank 1 (localhost pid 9) in wait at s.py:3", "exits": []},
         "smoke: failed: timed out after 20 s: rank 1 (localhost pid 9) in wait at s.py:3", 124),
        (job_log(2), 1, {"timeout": 20.0, "exits": []}, "smoke: failed: timed out after 20 s", 124),
    ],
)  # fmt: skip
def test_the_verdict_its_last_line_and_exit_status(log, returncode, extra, line, status):
    outcome = report.judge(log, returncode, 41.2, **extra)
    assert report.result_line(outcome) == line
    assert outcome.status == status
    assert outcome.passed == (status == 0)


def test_each_ranks_result():
    ranks = report.judge(job_log(2, *RAISED), 1, 9.0).ranks
    assert [(rank.rank, rank.status, rank.problem()) for rank in ranks] == [
        (0, 143, "exited with status 143 after rank 1 failed: Terminated"),
        (1, 1, "exited with status 1: RuntimeError: boom"),
    ]
    raced = report.judge(job_log(2, *RACE), 1, 9.0).ranks
    assert [rank.problem() for rank in raced] == [
        "exited with status 1 after rank 1 failed: horovod.common.exceptions.HorovodInternalError: Horovod has been "
        "shut down.",
        "exited with status 143: RuntimeError: boom",
    ]
    untold = report.judge(job_log(2, *RACE_UNTOLD), 1, 9.0).ranks  # seen in a full run: rank 1's case passed
    assert [(rank.status, rank.problem()) for rank in untold] == [
        (
            1,
            "exited with status 1 after rank 1 failed: horovod.common.exceptions.HorovodInternalError: Horovod has "
            "been shut down.",
        ),
        (None, "failed first, then horovodrun ended it: RuntimeError: boom"),
    ]
    timed = report.judge(job_log(2, "Process 0 exit with status code 134."), 1, 9.0, timeout=5, exits=[],
                         stacks={0: "rank 0 (localhost pid 7) in wait at s.py:3\n    wait (s.py:3)"}).ranks  # fmt: skip
    assert [rank.problem() for rank in timed] == [
        "still running at the timeout: rank 0 (localhost pid 7) in wait at s.py:3",
        "still running at the timeout",
    ]
    assert [rank.status for rank in report.judge(job_log(2, "[0]<stdout>:ok"), 0, 1.0).ranks] == [0, 0]


def test_junit_report_one_case_per_rank_and_the_job():
    outcome = report.judge(job_log(2, *RAISED, "[1]<stdout>:\x1b[2Kbar <&> \x00"), 1, 12.5)
    root = ET.fromstring(report.junit_xml(outcome, timestamp=0))
    suite = root.find("testsuite")
    assert suite is not None and root.get("tests") == "3" and root.get("failures") == "3"
    assert suite.get("timestamp") == "1970-01-01T00:00:00"
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert list(cases) == ["rank 0", "rank 1", "job: 2 ranks over Gloo"]
    failure = cases["rank 1"].find("failure")
    assert failure is not None and failure.get("message") == "exited with status 1: RuntimeError: boom"
    assert "[2Kbar <&> " in (failure.text or "")
    job = cases["job: 2 ranks over Gloo"].find("failure")
    assert job is not None and job.get("message") == "rank 1 exited with status 1: RuntimeError: boom"

    passed = ET.fromstring(report.junit_xml(report.judge(job_log(2, "[0]<stdout>:fine"), 0, 3.0)))
    assert passed.get("failures") == "0"
    assert [case.findtext("system-out") for case in passed.iter("testcase")] == [
        "fine", None, "smoke: passed: 2 ranks over Gloo in 3 s"]  # fmt: skip


def summary(accuracy: float | None = 0.93, digests: tuple[str, ...] = ("a", "a"), world_size: int = 2) -> dict:
    return {
        "world_size": world_size,
        "ranks": [{"rank": rank, "host": "h", "digest": digest} for rank, digest in enumerate(digests)],
        "final": None if accuracy is None else {"epoch": 3, "val_accuracy": accuracy},
    }


@pytest.mark.parametrize(
    "found, problem",
    [
        (summary(), None),
        (summary(accuracy=0.12), "the bundled trainer did not learn: validation accuracy 0.120, below 0.80"),
        (summary(digests=("a", "b", "a", "c"), world_size=4),
         "ranks 1, 3 ended with parameters different from rank 0's"),
        (summary(digests=("a", "b")), "rank 1 ended with parameters different from rank 0's"),
        (summary(world_size=1, digests=("a",)), "the bundled trainer ran on 1 ranks, not 2"),
        (summary(accuracy=None), "the bundled trainer reported no validation accuracy"),
        (None, "the bundled trainer wrote no summary (summary.json)"),
    ],
)  # fmt: skip
def test_the_bundled_trainers_checks(found, problem):
    size = found["world_size"] if found else 2
    assert trainer.verdict(found, 2 if size == 1 else size)[0] == problem


def test_the_bundled_trainers_command_and_summary(tmp_path):
    command = trainer.command(tmp_path, 2)
    assert command[:4] == ["python", "-P", "-m", "app.train"] and "--no-cuda" in command
    assert command[command.index("--epochs") + 1] == "2"
    assert command[command.index("--summary-file") + 1] == str(tmp_path / "summary.json")
    assert trainer.read_summary(tmp_path) is None
    (tmp_path / "summary.json").write_text('{"world_size": 2}')
    assert trainer.read_summary(tmp_path) == {"world_size": 2}
    assert trainer.verdict(summary(), 2)[1] == (
        "validation accuracy 0.930 after 3 epochs (chance 0.100), parameters identical on all 2 ranks"
    )


FAULTHANDLER = """\
stall-script rank 0 of 2 started
Fatal Python error: Aborted

Thread 0x00007f1c2d7fe640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f385ebfcb80 (most recent call first):
  File "/opt/venv/lib/python3.11/site-packages/horovod/torch/mpi_ops.py", line 1285 in synchronize
  File "/opt/venv/lib/python3.11/site-packages/horovod/torch/mpi_ops.py", line 254 in allreduce
  File "/workdir/stall.py", line 26 in main
  File "/workdir/stall.py", line 31 in <module>

Extension modules: torch._C, numpy._core._multiarray_umath (total: 2)
Aborted"""


@pytest.mark.parametrize(
    "text, frames",
    [
        (FAULTHANDLER, [("synchronize", "/opt/venv/lib/python3.11/site-packages/horovod/torch/mpi_ops.py", 1285),
                        ("allreduce", "/opt/venv/lib/python3.11/site-packages/horovod/torch/mpi_ops.py", 254),
                        ("main", "/workdir/stall.py", 26), ("<module>", "/workdir/stall.py", 31)]),
        ("Fatal Python error: Aborted\n\nThread 0x01 (most recent call first):\n  File \"a.py\", line 1 in f\n",
         [("f", "a.py", 1)]),
        ("no dump here", []),
        ("Fatal Python error: Aborted\n", []),
    ],
)  # fmt: skip
def test_faulthandlers_stacks(text, frames):
    found = hang.faulthandler_frames(text.splitlines())
    assert [(frame.function, frame.file, frame.line) for frame in found] == frames


@pytest.mark.parametrize(
    "argv, ranks, timeout, junit, command",
    [
        ([], 2, 600.0, None, ()),
        (["--np", "4", "--timeout", "20", "--", "python", "t.py", "--np", "5"], 4, 20.0, None,
         ("python", "t.py", "--np", "5")),
        (["--junit", "out/smoke.xml", "python", "t.py", "--epochs", "1"], 2, 600.0, Path("out/smoke.xml"),
         ("python", "t.py", "--epochs", "1")),
        (["--", "python", "t.py"], 2, 600.0, None, ("python", "t.py")),
    ],
)  # fmt: skip
def test_the_command_line(argv, ranks, timeout, junit, command):
    options = parse_options(argv)
    assert (options.ranks, options.timeout, options.junit, options.command) == (ranks, timeout, junit, command)


@pytest.mark.parametrize(
    "argv, error",
    [
        (["--np", "0"], "argument --np: must be more than 0 (got 0)"),
        (["--timeout", "-1"], "argument --timeout: must be more than 0 (got -1)"),
        (["--np", "two"], "argument --np: invalid int value: 'two'"),
    ],
)
def test_the_command_line_refuses(argv, error, capsys):
    with pytest.raises(SystemExit) as ended:
        parse_options(argv)
    assert ended.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"smoke: error: {error}"


def test_horovodrun_line_and_the_ranks_environment():
    assert run.horovodrun_argv(3, ["python", "t.py"]) == [
        "horovodrun", "--gloo", "-np", "3", "-H", "localhost:3", "--network-interfaces", "lo",
        "python", "t.py"]  # fmt: skip
    environment = run.rank_environment({"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0"}, 2, 4)
    assert environment["CUDA_VISIBLE_DEVICES"] == "" and environment["PATH"] == "/bin"
    assert environment["PYTHONFAULTHANDLER"] == "1" and environment["PYTHONDONTWRITEBYTECODE"] == "1"
    assert environment["OMP_NUM_THREADS"] == "2"
    assert run.rank_environment({}, 4, 2)["OMP_NUM_THREADS"] == "1"
    assert run.rank_environment({"OMP_NUM_THREADS": "3"}, 2, 2)["OMP_NUM_THREADS"] == "3"  # the caller's stands


SHM_FULL = "RuntimeError: unable to allocate shared memory(shm) for file </torch_612_1740263214_0>: No space left on device (28)"  # noqa: E501
"""torch's allocator in a DataLoader worker, /dev/shm full."""


@pytest.mark.parametrize(
    "text, out",
    [
        (SHM_FULL, True),
        ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
         True),
        ("RuntimeError: DataLoader worker (pid 42) is killed by signal: Bus error. It is possible that dataloader's "
         "workers are out of shared memory. Please try to raise your shared memory limit.", True),
        ("RuntimeError: unable to write to file </torch_18692_1954506624_0>: No space left on device (28)", True),
        ("OSError: [Errno 28] No space left on device: 'checkpoint.pt'", False),
        ("RuntimeError: boom", False),
    ],
)  # fmt: skip
def test_a_rank_out_of_shared_memory_is_recognised(text, out):
    assert shm.ran_out(f"line before\n{text}\nline after") is out


@pytest.mark.parametrize(
    "error, size, told",
    [
        ("RuntimeError: x", 64 * 1024**2, "out of shared memory (/dev/shm 64 MB, shared by the ranks and their "
         "DataLoader workers): give the container more, docker run --shm-size 1g ... (RuntimeError: x)"),
        (None, None, "out of shared memory (no /dev/shm, shared by the ranks and their DataLoader workers): give the "
         "container more, docker run --shm-size 1g ..."),
    ],
)  # fmt: skip
def test_shared_memory_is_named_with_its_fix(error, size, told):
    assert shm.explained(error, size) == told


def test_a_rank_out_of_shared_memory_fails_naming_it_and_the_flag_that_fixes_it():
    log = job_log(2, "[0]<stderr>:Traceback (most recent call last):", f"[0]<stderr>:{SHM_FULL}",
                  "Process 0 exit with status code 1.", "[1]<stderr>:Terminated",
                  "Process 1 exit with status code 143.")  # fmt: skip
    outcome = report.judge(log, 1, 9.0, shared_memory=64 * 1024**2)
    assert report.result_line(outcome) == (
        "smoke: failed: rank 0 exited with status 1: out of shared memory (/dev/shm 64 MB, shared by the ranks and "
        f"their DataLoader workers): give the container more, docker run --shm-size 1g ... ({SHM_FULL})"
    )
    assert outcome.ranks[1].problem() == "exited with status 143 after rank 0 failed: Terminated"
    assert report.result_line(report.judge(job_log(2, *RAISED), 1, 9.0, shared_memory=64 * 1024**2)) == (
        "smoke: failed: rank 1 exited with status 1: RuntimeError: boom"
    )


KERAS3 = (
    "Traceback (most recent call last):",
    '  File "/workdir/tensorflow2_mnist.py", line 64, in <module>',
    "    hvd.broadcast_variables(opt.variables(), root_rank=0)",
    "                            ^^^^^^^^^^^^^^^",
    "TypeError: 'list' object is not callable",
)
"""Keras 2 code (Horovod's TensorFlow 2 examples) on Keras 3: tests/test_legacy_keras.py has the rule's cases."""


@pytest.mark.parametrize(
    "environment, error",
    [
        ((), "Keras 2 code on Keras 3, horovod-stack:tensorflow's default (a Keras 3 optimizer's `variables` is a "
             "list, not a method): run it with TF_USE_LEGACY_KERAS=1 for Keras 2, docker run -e "
             "TF_USE_LEGACY_KERAS=1 ... smoke ... (TypeError: 'list' object is not callable)"),
        (("PATH=/bin", "TF_USE_LEGACY_KERAS=1"), "TypeError: 'list' object is not callable"),
    ],
)  # fmt: skip
def test_a_rank_that_died_of_keras2_code_on_keras3_fails_naming_the_setting_that_fixes_it(environment, error):
    log = job_log(2, *(f"[{rank}]<stderr>:{line}" for rank in (0, 1) for line in KERAS3),
                  "Process 0 exit with status code 1.", "Process 1 exit with status code 1.")  # fmt: skip
    outcome = report.judge(log, 1, 9.0, environment=environment)
    assert report.result_line(outcome) == f"smoke: failed: rank 0 exited with status 1: {error}"
    assert outcome.ranks[1].problem() == f"exited with status 1 after rank 0 failed: {error}"


def test_shared_memorys_size(tmp_path):
    assert shm.size_bytes(str(tmp_path)) == os.statvfs(tmp_path).f_blocks * os.statvfs(tmp_path).f_frsize > 0
    assert shm.size_bytes(str(tmp_path / "none")) is None
    assert shm.shown(64 * 1024**2) == "/dev/shm 64 MB" and shm.shown(None) == "no /dev/shm"


@pytest.mark.parametrize(
    "exists, writable, blocking",
    [
        ({"/w", "/w/reports", "/w/reports/s.xml"}, {"/w/reports/s.xml"}, None),
        ({"/w", "/w/reports", "/w/reports/s.xml"}, {"/w", "/w/reports"}, "/w/reports/s.xml"),
        ({"/w", "/w/reports"}, {"/w/reports"}, None),
        ({"/w"}, {"/w"}, None),  # reports/ is made
        ({"/w"}, set(), "/w"),
        ({"/w", "/w/reports"}, {"/w"}, "/w/reports"),
    ],
)
def test_what_keeps_the_report_from_being_written(monkeypatch, exists, writable, blocking):
    monkeypatch.setattr(Path, "exists", lambda path: str(path) in exists | {"/"})
    found = access.blocking_of(Path("/w/reports/s.xml"), can_write=lambda path: str(path) in writable)
    assert found == (Path(blocking) if blocking else None)


def test_a_user_who_cannot_write_the_report_is_told_the_fix_in_one_line(tmp_path):
    assert access.refusal(1000, Path("reports/smoke.xml"), Path("/workdir"), (1001, 1001)) == (
        "smoke: failed: uid 1000 cannot write the JUnit report reports/smoke.xml (/workdir is owned by 1001:1001): "
        "run the container as root, the image's default (no --user), or as the folder's owner, "
        'docker run --user "$(id -u):$(id -g)" ...'
    )
    assert access.report_problem(tmp_path / "reports" / "smoke.xml") is None
