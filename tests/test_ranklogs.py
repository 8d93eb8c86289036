"""`launcher logs --rank N --grep TEXT --tee DIR`: which rank wrote a job's line, what is shown, where --tee puts it."""

from __future__ import annotations

import io

import pytest

from launcher.core import ranktag
from launcher.host import ranklogs


@pytest.mark.parametrize("line, tagged", [
    ("[1,3]<stdout>:epoch 1 done\n", (3, "stdout", "epoch 1 done\n")),  # mpirun --tag-output
    ("[1,12]<stderr>:  File \"t.py\", line 3\n", (12, "stderr", '  File "t.py", line 3\n')),
    ("[2]<stdout>:hello", (2, "stdout", "hello")),  # elastic horovodrun
    ("[1,0]<stdout>:", (0, "stdout", "")),
    ("[1,0]<stdout>:[1,1]<stdout>:x", (0, "stdout", "[1,1]<stdout>:x")),  # the rank's own text is left as it is
    ("12:00:01 [rank 0] epoch 1/3\n", None),
    ("x [1,0]<stdout>:not at the start\n", None),
    ("[1,x]<stdout>:not a tag\n", None),
    ("[1,0]<stdin>:not a stream\n", None),
])
def test_the_rank_tag_is_read_and_taken_off(line, tagged):
    assert ranktag.split_tag(line) == tagged
    assert ranktag.untagged(line) == (tagged[2] if tagged else line)
    assert ranktag.tagged_rank(line) == (tagged[0] if tagged else None)


@pytest.mark.parametrize("line, rank", [
    ("[1,3]<stdout>:epoch 1 done\n", 3),  # mpirun --tag-output
    ("[1,12]<stderr>:Traceback (most recent call last):\n", 12),
    ("[2]<stdout>:hello\n", 2),  # elastic horovodrun
    ("12:00:01 [rank 0] epoch 1/3: train loss 0.5\n", 0),  # the bundled trainer
    ("[rank 1] plan: 2 ranks\n", 1),
    ("[agent 12:00:01] restart 1/2: node_2 went silent; starting over on node_1\n", None),
    ("plain output of a script\n", None),
    ("a line that mentions [rank 3] later\n", None),
    ("[1,x]<stdout>:not a tag\n", None),
])
def test_the_rank_a_line_names(line, rank):
    assert ranklogs.rank_of(line) == rank


@pytest.mark.parametrize("line, rank, grep, shown", [
    ("[1,0]<stdout>:epoch 1\n", 0, None, True),
    ("[1,1]<stdout>:epoch 1\n", 0, None, False),
    ("[1,1]<stdout>:epoch 1\n", None, "epoch", True),
    ("[1,1]<stdout>:loss 0.5\n", None, "epoch", False),
    ("[1,1]<stdout>:epoch 1\n", 1, "epoch", True),
    ("[agent 12:00:01] running: mpirun\n", 0, None, False),
    ("[agent 12:00:01] running: mpirun\n", None, None, True),
])
def test_what_rank_and_grep_keep(line, rank, grep, shown):
    assert ranklogs.shown(line, rank, grep) is shown


def test_lines_arriving_in_pieces_are_filtered_whole():
    pieces = ["[1,0]<stdout>:ep", "och 1\n[1,1]<stdout>:epoch 1\n[1,", "0]<stdout>:epoch 2"]
    assert list(ranklogs.selected(pieces, 0, None)) == ["[1,0]<stdout>:epoch 1\n", "[1,0]<stdout>:epoch 2"]


def test_tee_writes_one_file_per_rank_whatever_is_shown(tmp_path):
    out = io.StringIO()
    job = ["[agent 12:00:00] hostfile: 10.0.0.1:1 10.0.0.2:1\n", "[1,0]<stdout>:epoch 1\n", "[1,1]<stderr>:warn\n",
           "[1,0]<stdout>:epoch 2\n"]
    ranklogs.relay(["".join(job)], out, rank=1, grep=None, tee=ranklogs.Tee(tmp_path / "ranks"))
    assert out.getvalue() == "[1,1]<stderr>:warn\n"
    assert sorted(path.name for path in (tmp_path / "ranks").iterdir()) == ["other.log", "rank-0.log", "rank-1.log"]
    assert (tmp_path / "ranks" / "rank-0.log").read_text() == "[1,0]<stdout>:epoch 1\n[1,0]<stdout>:epoch 2\n"
    assert (tmp_path / "ranks" / "other.log").read_text() == job[0]


def test_without_tee_nothing_is_written(tmp_path):
    out = io.StringIO()
    ranklogs.relay(["x\n", "[1,0]<stdout>:y\n"], out, rank=None, grep="y")
    assert out.getvalue() == "[1,0]<stdout>:y\n" and list(tmp_path.iterdir()) == []


def test_logs_takes_the_new_options():
    from tests.test_docs import cli_options

    assert {"--rank", "--grep", "--tee", "--node", "--follow", "--tail"} <= cli_options()["logs"]
