"""Where a hung job hangs: grouping the ranks' stacks, the stall decision, Horovod's own warnings, and the agent's
stall watch against a stand-in transport. (The real py-spy, ranks and containers: test_launcher_multihost.py and
test_compose.py.)"""

from __future__ import annotations

import json
import time

import pytest

from launcher.agent import stacks
from launcher.agent.job import Agent
from launcher.agent.stacks import Frame, RankStack
from launcher.agent.watches import StallWatch
from launcher.core import stall
from launcher.core.jobspec import Worker
from launcher.core.protocol import JOB_STALL
from launcher.host.engines.node_engine import ContainerState
from launcher.host.running import jobstate
from tests.conftest import job_spec
from tests.standins import StandInTransport

SITE = "/opt/venv/lib/python3.11/site-packages"
COLLECTIVE = (
    Frame("synchronize", f"{SITE}/horovod/torch/mpi_ops.py", 1037),
    Frame("allreduce", f"{SITE}/horovod/torch/mpi_ops.py", 240),
    Frame("main", "/workdir/stall.py", 30),
)
OWN_WAIT = (Frame("wait_for_data", "/workdir/stall.py", 14), Frame("main", "/workdir/stall.py", 28))
LOADER = (Frame("load_batch", "/workdir/data.py", 40), Frame("main", "/workdir/train.py", 12))


def rank(number, node, frames, pid=100):
    return RankStack(number, node, pid + number, frames)


def test_identical_stacks_print_once_with_every_rank_named():
    found = [
        rank(0, "node_1", COLLECTIVE),
        rank(2, "node_2", COLLECTIVE),
        rank(1, "node_1", OWN_WAIT),
        rank(3, "node_2", COLLECTIVE),
    ]
    groups = stacks.group(found)
    assert [found.headline() for found in groups] == [
        "ranks 0,2,3 (node_1 pid 100, node_2 pid 102, node_2 pid 103) in synchronize at mpi_ops.py:1037, from main at "
        "stall.py:30",
        "rank 1 (node_1 pid 101) in wait_for_data at stall.py:14",
    ]
    report = stacks.report(found)
    assert report.count("synchronize (") == 1 and "    wait_for_data (/workdir/stall.py:14)\n" in report


@pytest.mark.parametrize(
    "found, odd",
    [
        # The rank outside Horovod is the one the others wait for, even when the groups are the same size.
        ([rank(0, "a", COLLECTIVE), rank(1, "b", OWN_WAIT)], ["rank 1"]),
        ([rank(0, "a", COLLECTIVE), rank(1, "b", COLLECTIVE), rank(2, "c", OWN_WAIT)], ["rank 2"]),
        # None inside Horovod: the smaller groups.
        ([rank(0, "a", LOADER), rank(1, "a", LOADER), rank(2, "b", OWN_WAIT)], ["rank 2"]),
        # All alike: every rank.
        ([rank(0, "a", COLLECTIVE), rank(1, "b", COLLECTIVE)], ["ranks 0,1"]),
    ],
)
def test_the_odd_ranks_out(found, odd):
    assert [group.numbers for group in stacks.odd_ones_out(stacks.group(found))] == odd


def test_the_summary_names_the_odd_rank_and_where_the_others_wait():
    text = stacks.summary([rank(0, "node_1", COLLECTIVE), rank(1, "node_2", OWN_WAIT)])
    assert text == (
        "rank 1 (node_2 pid 101) in wait_for_data at stall.py:14 while rank 0 in synchronize at "
        "mpi_ops.py:1037, from main at stall.py:30"
    )


def test_a_rank_without_a_stack_says_why():
    found = [RankStack(0, "node_1", 7, error="py-spy: Permission denied (os error 13)")]
    assert stacks.report(found) == "rank 0 (node_1 pid 7) no stack (py-spy: Permission denied (os error 13))\n"
    assert stacks.report([]) == "no rank process found (is a job running?)\n"


def test_py_spys_json_gives_the_main_threads_frames_and_survives_the_trip():
    dump = [
        {"os_thread_id": 9, "frames": [{"name": "loop", "filename": "/x/bg.py", "line": 3}]},
        {
            "os_thread_id": 42,
            "frames": [
                {"name": "wait_for_data", "filename": "/workdir/stall.py", "line": 14},
                {"name": "<module>", "filename": "/workdir/stall.py", "line": 40},
            ],
        },
    ]
    frames = stacks.main_thread_frames(dump, 42)
    assert frames == (Frame("wait_for_data", "/workdir/stall.py", 14), Frame("<module>", "/workdir/stall.py", 40))
    found = [RankStack(1, "node_2", 42, frames)]
    assert stacks.from_json(stacks.to_json(found)) == found


def test_rank_processes_are_found_by_their_rank_variable(tmp_path):
    for pid, environ in (
        (10, b"PATH=/bin\0OMPI_COMM_WORLD_RANK=1\0"),
        (11, b"HOROVOD_RANK=0\0"),
        (12, b"PATH=/bin\0"),
        (13, b"OMPI_COMM_WORLD_RANK=1\0"),
    ):  # 13: rank 1's child
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "environ").write_bytes(environ)
    (tmp_path / "self").mkdir()
    assert stacks.rank_processes(tmp_path) == [(0, 11), (1, 10)]


def test_a_slurm_jobs_ranks_alone_where_the_users_other_job_shares_the_node(tmp_path):
    for pid, environ in ((20, b"HOROVOD_RANK=0\0SLURM_JOB_ID=7\0"), (21, b"HOROVOD_RANK=0\0SLURM_JOB_ID=8\0")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "environ").write_bytes(environ)
    assert stacks.rank_processes(tmp_path, only="SLURM_JOB_ID=8") == [(0, 21)]


@pytest.mark.parametrize(
    "output_age, metrics_age, timeout, stalled",
    [
        (30, None, 20, True),
        (30, 5, 20, False),  # new metrics: progress, though nothing was printed
        (10, None, 20, False),
        (999, 999, 0, False),  # 0: no watch
    ],
)
def test_a_job_is_stalled_when_neither_output_nor_metrics_moved(output_age, metrics_age, timeout, stalled):
    assert stall.is_stalled(stall.idle_seconds(output_age, metrics_age), timeout) is stalled


def test_horovods_stall_warning_is_picked_out_of_the_output():
    warnings = stall.HorovodWarnings()
    for line in [
        "epoch 1/5: loss 0.3\n",
        "[2026-12-01 12:00:00.000: W /tmp/horovod/common/stall_inspector.cc:105] One or more tensors were "
        "submitted to be reduced, gathered or broadcasted by subset of ranks and are waiting for remainder "
        "of ranks for more than 10 seconds. This may indicate that different ranks ...\n",
        "Missing ranks:\n",
        "1: [allreduce.after_the_wait]\n",
        "3!: [allreduce.a, allreduce.b]\n",
        "next output\n",
    ]:
        assert warnings.feed(line) is (line.startswith(("[2026", "Missing", "1:", "3!:")))
    assert warnings.current() == (
        "Horovod: rank 1 missing from allreduce.after_the_wait; rank 3 missing from allreduce.a, allreduce.b"
    )


def test_horovods_stall_warning_is_read_through_the_rank_tag():
    warnings = stall.HorovodWarnings()
    for line in [
        "[1,0]<stderr>:[2026-12-01 12:00:00.000: W /tmp/horovod/common/stall_inspector.cc:105] One or more "
        "tensors were submitted to be reduced\n",
        "[1,0]<stderr>:Missing ranks:\n",
        "[1,0]<stderr>:1: [allreduce.after_the_wait]\n",
        "[1,1]<stdout>:next output\n",
    ]:
        assert warnings.feed(line) is ("next" not in line)
    assert warnings.current() == "Horovod: rank 1 missing from allreduce.after_the_wait"


def test_horovods_stall_warning_that_reached_mpirun_in_pieces_is_no_progress():
    """As the job's log showed it on a busy node: mpirun tags each piece of one line again, inside the line. Read as
    progress, these lines kept a hung job from ever looking stalled."""
    warnings = stall.HorovodWarnings()
    for line in [
        "[1,0]<stderr>:[[1,0]<stderr>:2026-12-05 10:31:42[1,0]<stderr>:.[1,0]<stderr>:859020[1,0]<stderr>:: "
        "[1,0]<stderr>:W[1,0]<stderr>: [1,0]<stderr>:/tmp/horovod/common/stall_inspector.cc[1,0]<stderr>::"
        "[1,0]<stderr>:107[1,0]<stderr>:] [1,0]<stderr>:One or more tensors were submitted to be reduced\n",
        "[1,0]<stderr>:Missing ranks:\n",
        "[1,0]<stderr>:1: [allreduce.after_the_wait][1,0]<stderr>:\n",
    ]:
        assert warnings.feed(line) is True, line
    assert warnings.current() == "Horovod: rank 1 missing from allreduce.after_the_wait"


def test_status_says_stalled_with_the_odd_ranks_out():
    record = stall.StallRecord(
        40, "rank 1 (node_2 pid 88) in wait_for_data at stall.py:14", "Horovod: rank 1 missing from allreduce.x"
    )
    line = jobstate.describe(ContainerState("node_1", True), None, [], metrics="", stall=record.to_json())
    assert line == (
        "running: no epoch finished yet; stalled for 40 s: rank 1 (node_2 pid 88) in wait_for_data at "
        "stall.py:14; Horovod: rank 1 missing from allreduce.x"
    )
    assert jobstate.describe(
        ContainerState("node_1", True), None, [], metrics="", stall=stall.StallRecord().to_json()
    ) == ("running: no epoch finished yet")


WORKERS = [Worker("node_1", "10.0.0.1"), Worker("node_2", "10.0.0.2")]


@pytest.mark.parametrize("action", ["warn", "fail"])
def test_the_stall_watch_gathers_the_stacks_once_and_ends_the_job_only_when_asked(action):
    spec = job_spec(
        job_id="j",
        command=("python", "stall.py"),
        expected_workers=2,
        workers=tuple(WORKERS),
        stall_timeout=1,
        stall_action=action,
    )
    # A job that never prints again: rank 0 waits in the collective (node_1), rank 1 in its own code (node_2).
    waiting = {"10.0.0.1": [RankStack(0, "node_1", 50, COLLECTIVE)], "10.0.0.2": [RankStack(1, "node_2", 50, OWN_WAIT)]}
    said: list[str] = []

    class Transport(StandInTransport):
        stall_while_stacks_taken: list[str | None] = []

        def ssh(self, address: str, command: str, timeout: float, stdin: str = "") -> tuple[int, str]:
            self.stall_while_stacks_taken.append(self.files.get(JOB_STALL))
            return super().ssh(address, command, timeout, stdin)

    transport = Transport(stacks_of=waiting)
    watch = StallWatch(Agent(spec, transport, say=said.append).workers, WORKERS)  # type: ignore[arg-type]
    watch.start()
    assert transport.ended.wait(3) is (action == "fail")
    watch.stop()
    assert [address for address, _ in transport.commands] == ["10.0.0.1", "10.0.0.2"]  # once, not every round
    assert "python -m launcher.agent.stacks collect --node node_2" in transport.commands[1][1]
    assert any(line.startswith("rank 1 (node_2 pid 50) in wait_for_data at stall.py:14") for line in said)
    # `launcher status` says "stalled" while the stacks are taken, not only after.
    assert stall.StallRecord.from_json(transport.stall_while_stacks_taken[0]) == stall.StallRecord(999)
    record = stall.StallRecord.from_json(transport.files[JOB_STALL])
    assert (
        record is not None
        and record.idle_seconds == 999
        and record.where.startswith("rank 1 (node_2 pid 50) in wait_for_data")
    )
    if action == "fail":
        assert watch.cause is not None and watch.cause.startswith(
            "the job stalled: no output and no new metrics for 999 s; rank 1 (node_2"
        )
    else:
        assert watch.cause is None
    assert json.loads(transport.files[JOB_STALL])["horovod"] is None


def test_a_stall_that_ends_is_said_with_its_length_not_the_new_outputs_age():
    spec = job_spec(
        job_id="j", command=("python", "stall.py"), expected_workers=2, workers=tuple(WORKERS), stall_timeout=1
    )
    waiting = {"10.0.0.1": [RankStack(0, "node_1", 50, COLLECTIVE)], "10.0.0.2": [RankStack(1, "node_2", 50, OWN_WAIT)]}
    said: list[str] = []

    class Transport(StandInTransport):
        ages = iter([40.0, 41.0])  # then new output: 0.2 s old

        def output_age(self) -> float:
            return next(self.ages, 0.2)

    watch = StallWatch(Agent(spec, Transport(stacks_of=waiting), say=said.append).workers, WORKERS)  # type: ignore[arg-type]
    watch.start()
    deadline = time.monotonic() + 10
    while not any("progress again" in line for line in said):
        assert time.monotonic() < deadline, said
        time.sleep(0.1)
    watch.stop()
    assert "the job shows progress again after a stall of 41 s or more" in said


@pytest.mark.parametrize(
    "bound, gains",
    [
        ("00000000a80c25fb", True),  # Docker's defaults and SYS_PTRACE (a worker's cap_add)
        ("00000000a80425fb", False),  # Docker's defaults alone (--no-ptrace)
        ("0000000000000000", False),  # an unprivileged user's Apptainer container
        (None, True),  # no such line: the image's py-spy, as before
    ],
)
def test_py_spy_without_its_capability_where_the_bounding_set_lacks_it(bound, gains):
    status = "Name:\tpython\n" + (f"CapBnd:\t{bound}\n" if bound else "") + "NoNewPrivs:\t1\n"
    assert stacks.may_gain_ptrace(status) is gains
