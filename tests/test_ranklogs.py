"""`launcher logs --rank N --grep TEXT --tee DIR` and `launcher start --ranks 0,3`: which rank wrote a job's line, what
is shown, where --tee puts it."""

from __future__ import annotations

import io

import pytest
from typer.testing import CliRunner

from launcher import cli
from launcher.core import ranktag
from launcher.core.jobend import JobEnd
from launcher.core.options import SettingsError
from launcher.core.ranks import parse_ranks
from launcher.host.planning.plan import Node
from launcher.host.running import follow, ranklogs
from tests.standins import PartialEngine, container


@pytest.mark.parametrize(
    "line, tagged",
    [
        ("[1,3]<stdout>:epoch 1 done\n", (3, "stdout", "epoch 1 done\n")),  # mpirun --tag-output
        ('[1,12]<stderr>:  File "t.py", line 3\n', (12, "stderr", '  File "t.py", line 3\n')),
        ("[2]<stdout>:hello", (2, "stdout", "hello")),  # elastic horovodrun
        ("[1,0]<stdout>:", (0, "stdout", "")),
        ("[1,0]<stdout>:[1,1]<stdout>:x", (0, "stdout", "[1,1]<stdout>:x")),  # the rank's own text is left as it is
        # A line that reached mpirun in pieces: the same rank's tag again before each piece.
        (
            "[1,0]<stderr>:[[1,0]<stderr>:2026-12-05 10:31:42[1,0]<stderr>:.5: W\n",
            (0, "stderr", "[2026-12-05 10:31:42.5: W\n"),
        ),
        ("[1,0]<stderr>:1: [allreduce.x][1,0]<stderr>:\n", (0, "stderr", "1: [allreduce.x]\n")),
        ("[1,0]<stderr>:a[1,0]<stdout>:b\n", (0, "stderr", "a[1,0]<stdout>:b\n")),  # another stream's tag: text
        ("[1,2]<stddiag>:Open MPI's own warning\n", (2, "stddiag", "Open MPI's own warning\n")),
        ("[1,0]<stdout>: epoch 1\n", (0, "stdout", " epoch 1\n")),  # Open MPI 5: a space after the colon
        ("[prterun-gpu-a-4242@1,3]<stderr>: boom", (3, "stderr", " boom")),  # Open MPI 5: the job as a namespace
        ("12:00:01 [rank 0] epoch 1/3\n", None),
        ("x [1,0]<stdout>:not at the start\n", None),
        ("[1,x]<stdout>:not a tag\n", None),
        ("[1,0]<stdin>:not a stream\n", None),
    ],
)
def test_the_rank_tag_is_read_and_taken_off(line, tagged):
    assert ranktag.split_tag(line) == tagged
    assert ranktag.untagged(line) == (tagged[2] if tagged else line)
    assert ranktag.tagged_rank(line) == (tagged[0] if tagged else None)


@pytest.mark.parametrize(
    "line, rank",
    [
        ("[1,3]<stdout>:epoch 1 done\n", 3),  # mpirun --tag-output
        ("[1,12]<stderr>:Traceback (most recent call last):\n", 12),
        ("[2]<stdout>:hello\n", 2),  # elastic horovodrun
        ("12:00:01 [rank 0] epoch 1/3: train loss 0.5\n", 0),  # the bundled trainer
        ("[rank 1] plan: 2 ranks\n", 1),
        ("[agent 12:00:01] restart 1/2: node_2 went silent; starting over on node_1\n", None),
        ("plain output of a script\n", None),
        ("a line that mentions [rank 3] later\n", None),
        ("[1,x]<stdout>:not a tag\n", None),
    ],
)
def test_the_rank_a_line_names(line, rank):
    assert ranklogs.rank_of(line) == rank


@pytest.mark.parametrize(
    "line, rank, grep, shown",
    [
        ("[1,0]<stdout>:epoch 1\n", 0, None, True),
        ("[1,1]<stdout>:epoch 1\n", 0, None, False),
        ("[1,1]<stdout>:epoch 1\n", None, "epoch", True),
        ("[1,1]<stdout>:loss 0.5\n", None, "epoch", False),
        ("[1,1]<stdout>:epoch 1\n", 1, "epoch", True),
        ("[agent 12:00:01] running: mpirun\n", 0, None, False),
        ("[agent 12:00:01] running: mpirun\n", None, None, True),
    ],
)
def test_what_rank_and_grep_keep(line, rank, grep, shown):
    assert ranklogs.shown(line, rank, grep) is shown


def test_lines_arriving_in_pieces_are_filtered_whole():
    pieces = ["[1,0]<stdout>:ep", "och 1\n[1,1]<stdout>:epoch 1\n[1,", "0]<stdout>:epoch 2"]
    out = io.StringIO()
    ranklogs.relay(pieces, out, 0, None)
    assert out.getvalue() == "[1,0]<stdout>:epoch 1\n[1,0]<stdout>:epoch 2"


def test_tee_writes_one_file_per_rank_whatever_is_shown(tmp_path):
    out = io.StringIO()
    job = [
        "[agent 12:00:00] hostfile: 10.0.0.1:1 10.0.0.2:1\n",
        "[1,0]<stdout>:epoch 1\n",
        "[1,1]<stderr>:warn\n",
        "[1,0]<stdout>:epoch 2\n",
    ]
    ranklogs.relay(["".join(job)], out, rank=1, grep=None, tee=ranklogs.Tee(tmp_path / "ranks"))
    assert out.getvalue() == "[1,1]<stderr>:warn\n"
    assert sorted(path.name for path in (tmp_path / "ranks").iterdir()) == ["other.log", "rank-0.log", "rank-1.log"]
    assert (tmp_path / "ranks" / "rank-0.log").read_text() == "[1,0]<stdout>:epoch 1\n[1,0]<stdout>:epoch 2\n"
    assert (tmp_path / "ranks" / "other.log").read_text() == job[0]


def test_without_tee_nothing_is_written(tmp_path):
    out = io.StringIO()
    ranklogs.relay(["x\n", "[1,0]<stdout>:y\n"], out, rank=None, grep="y")
    assert out.getvalue() == "[1,0]<stdout>:y\n" and list(tmp_path.iterdir()) == []


# --- logs --node: the lines of the ranks that ran on a node ----------------------------------------------------------
RESTARTED_JOB = [
    "[agent 12:00:00] hostfile: 10.0.0.1:2 10.0.0.2:1\n",
    "[agent 12:00:00] ranks by node: node_1 0-1, node_2 2\n",
    "[1,0]<stdout>:epoch 1\n",
    "[1,2]<stdout>:node_2 here\n",
    "12:00:03 [rank 0] epoch 1 done\n",
    "[agent 12:00:09] restart 1/1: node_2's worker was lost; resuming after epoch 1 on node_1,node_3\n",
    "[agent 12:00:10] ranks by node: node_1 0-1, node_3 2\n",
    "[1,2]<stdout>:node_3 here\n",
    "[1,1]<stderr>:rank 1 warns\n",
]


@pytest.mark.parametrize(
    "node, rank, grep, shown",
    [
        ("node_2", None, None, ["[1,2]<stdout>:node_2 here\n"]),
        ("node_3", None, None, ["[1,2]<stdout>:node_3 here\n"]),  # a restart's ranks are the spare's
        (
            "node_1",
            None,
            None,
            ["[1,0]<stdout>:epoch 1\n", "12:00:03 [rank 0] epoch 1 done\n", "[1,1]<stderr>:rank 1 warns\n"],
        ),
        ("node_1", 1, None, ["[1,1]<stderr>:rank 1 warns\n"]),
        ("node_1", None, "epoch", ["[1,0]<stdout>:epoch 1\n", "12:00:03 [rank 0] epoch 1 done\n"]),
        ("node_9", None, None, []),
    ],
)
def test_node_keeps_the_lines_of_the_ranks_placed_there_as_each_run_placed_them(node, rank, grep, shown):
    out = io.StringIO()
    ranklogs.relay(["".join(RESTARTED_JOB)], out, rank, grep, node=ranklogs.NodeView(node))
    assert out.getvalue() == "".join(shown)


@pytest.mark.parametrize(
    "counts, line",
    [
        ([("node_1", 2), ("node_2", 1)], "ranks by node: node_1 0-1, node_2 2"),
        ([("node_1", 1)], "ranks by node: node_1 0"),
        ([("10.0.0.1", 4), ("10.0.0.2", 4)], "ranks by node: 10.0.0.1 0-3, 10.0.0.2 4-7"),
    ],
)
def test_a_placement_line_says_which_ranks_each_node_runs_and_reads_back(counts, line):
    from launcher.core.ranks import placement_line, read_placement

    assert placement_line(counts) == line
    first = 0
    expected = {}
    for node, count in counts:
        expected[node], first = range(first, first + count), first + count
    assert read_placement(line) == expected
    assert read_placement("hostfile: 10.0.0.1:1") is None and read_placement("ranks by node: node_1 x") is None


def test_logs_node_shows_the_workers_own_output_then_its_ranks_lines_or_says_why_none():
    out = io.StringIO()
    own = [b"[worker 12:00:00] sshd listening\n"]
    note = ranklogs.show(own, ["".join(RESTARTED_JOB).encode()], out, None, None, None, "node_2")
    assert (out.getvalue(), note) == ("[worker 12:00:00] sshd listening\n[1,2]<stdout>:node_2 here\n", None)
    elastic = [b"[agent 12:00:00] running: horovodrun ...\n[1]<stdout>:epoch 1\n"]
    note = ranklogs.show([], elastic, io.StringIO(), None, None, None, "node_2")
    assert note is not None and note.startswith("no line of the job's output is placed on node_2: an elastic job's")
    whole = io.StringIO()
    assert ranklogs.show(own, [b"[1,2]<stdout>:x\n"], whole, None, None, None, None) is None
    assert whole.getvalue() == "[worker 12:00:00] sshd listening\n[1,2]<stdout>:x\n"


def test_logs_takes_the_new_options():
    from tests.test_docs import cli_options

    assert {"--rank", "--grep", "--tee", "--node", "--follow", "--tail"} <= cli_options()["logs"]


# --- start --ranks: the live view --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, ranks",
    [
        ("0", {0}),
        ("0,3", {0, 3}),
        (" 3 , 0 ", {0, 3}),
        ("2,2,", {2}),
        ("12", {12}),
    ],
)
def test_the_ranks_a_list_names(text, ranks):
    assert parse_ranks(text) == frozenset(ranks)


@pytest.mark.parametrize(
    "text, why",
    [
        ("x", "'x' is not a rank"),
        ("-1", "'-1' is not a rank"),
        ("0,x", "'x' is not a rank"),
        ("1.5", "'1.5' is not a rank"),
        ("\u0663", "'\u0663' is not a rank"),  # a digit, but not one a rank number is written in
        ("", "it names no rank"),
        (" , ", "it names no rank"),
    ],
)
def test_a_list_that_is_not_ranks_is_refused_naming_the_flag_and_the_fix(text, why):
    with pytest.raises(SettingsError) as refused:
        parse_ranks(text)
    assert str(refused.value) == (f"--ranks {text!r}: {why}; pass rank numbers from 0, e.g. --ranks 0 or --ranks 0,3")


@pytest.mark.parametrize(
    "line, ranks, shown",
    [
        ("[1,0]<stdout>:epoch 1\n", {0}, True),
        ("[1,3]<stderr>:Traceback (most recent call last):\n", {0, 3}, True),
        ("[1,1]<stdout>:epoch 1\n", {0, 3}, False),
        ("[2]<stdout>:elastic\n", {2}, True),
        ("12:00:01 [rank 0] epoch 1/3: train loss 0.5\n", {0}, True),
        ("an untagged line\n", {0}, False),
        ("an untagged line\n", None, True),
        ("[1,1]<stdout>:epoch 1\n", None, True),
    ],
)
def test_what_the_live_view_shows(line, ranks, shown):
    assert ranklogs.in_view(line, ranks) is shown


class FollowedRank0(PartialEngine):
    """Rank 0's engine as follow_job reads it: the agent's log in chunks that cut lines, then the job's end."""

    node = Node("node_1", "ssh://node_1")

    def __init__(self, log: bytes) -> None:
        self.log = log

    def exec_stream(self, container_id, argv):
        return "exec-1", iter(self.log[start : start + 5] for start in range(0, len(self.log), 5))

    def read_file(self, container_id, path):
        return JobEnd(0).to_json() + "\n"

    def worker_problem(self, container_id):
        return None


def test_start_shows_the_agents_lines_and_the_chosen_ranks_only():
    log = (
        b"[agent 12:00:00] running: mpirun -np 2\n[1,0]<stdout>:rank 0 here\n[1,1]<stdout>:rank 1 here\n"
        b"untagged\n[1,1]<stderr>:rank 1's last, without an end"
    )
    out, relayed = io.StringIO(), list[str]()
    end = follow.follow_job(FollowedRank0(log), container("c1-node_1", "c1"), out, relayed.append, {0})
    assert end is not None and end.status == 0
    assert relayed == ["[agent 12:00:00] running: mpirun -np 2"]
    assert out.getvalue() == "[1,0]<stdout>:rank 0 here\n"
    everything = io.StringIO()
    follow.follow_job(FollowedRank0(log), container("c1-node_1", "c1"), everything, lambda _: None)
    assert everything.getvalue() == log.decode().split("\n", 1)[1]


@pytest.fixture
def started(monkeypatch, tmp_path) -> list:
    """The settings that reached launch.launch from `launcher start`."""
    monkeypatch.chdir(tmp_path)  # no .env of the checkout's
    calls: list = []

    def launched(settings, **_) -> int:
        calls.append(settings)
        return 0

    monkeypatch.setattr(cli.launch, "launch", launched)
    monkeypatch.setattr(cli, "stop_on_signals", lambda: None)
    return calls


@pytest.mark.parametrize(
    "ranks, expected",
    [
        ("x", "error: --ranks 'x': 'x' is not a rank; pass rank numbers from 0, e.g. --ranks 0 or --ranks 0,3"),
        ("-1", "error: --ranks '-1': '-1' is not a rank; pass rank numbers from 0, e.g. --ranks 0 or --ranks 0,3"),
        ("0,4", "error: --ranks names rank 4, but the job has at most 4 ranks: pass ranks from 0 to 3"),
    ],
)
def test_start_refuses_a_bad_ranks_list_before_anything_starts(started, ranks, expected):
    result = CliRunner().invoke(cli.app, ["start", "--nodes", "a,b", "--slots", "2", "--ranks", ranks])
    assert result.exit_code == 2
    assert result.output.splitlines() == [expected]
    assert started == []


def test_start_hands_the_chosen_ranks_to_the_launch(started):
    for extra in ([], ["--ranks", "0,3"]):
        result = CliRunner().invoke(cli.app, ["start", "--nodes", "a,b", "--slots", "2", *extra])
        assert result.exit_code == 0, result.output
    assert [settings.shown_ranks for settings in started] == [None, frozenset({0, 3})]
