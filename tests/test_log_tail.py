"""`launcher status` reads the job's records, never its log; `launcher logs --tail N` reads its last lines, and a log
is streamed block by block, never whole in memory."""

from __future__ import annotations

import io
import tarfile
from itertools import chain

import pytest

from launcher.core.jobend import JobEnd
from launcher.core.protocol import JOB_LOG, JOB_STATUS
from launcher.host.engines import streams
from launcher.host.planning.plan import Node
from launcher.host.running import clusters, jobstate
from tests.standins import PartialEngine, container


def chunked(data: bytes, size: int = 7) -> list[bytes]:
    return [data[start : start + size] for start in range(0, len(data), size)]


@pytest.mark.parametrize(
    "data, count, expected",
    [
        (b"", 3, b""),
        (b"a\nb\nc\nd\n", 2, b"c\nd\n"),
        (b"a\nb\nc\nd", 2, b"c\nd"),  # a last line without its newline counts
        (b"a\nb\n", 5, b"a\nb\n"),
        (b"a\nb\n", 0, b""),
    ],
)
def test_the_tail_of_a_stream_in_lines(data, count, expected):
    assert streams.tail_lines(chunked(data, 3), count) == expected


def one_file_archive(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("job.log")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_file_from_the_engine_arrives_block_by_block():
    data = b"x" * (3 * streams.BLOCK + 5)
    blocks = list(streams.file_in_archive(iter(chunked(one_file_archive(data), 10_000))))
    assert b"".join(blocks) == data and max(len(block) for block in blocks) <= streams.BLOCK
    assert list(streams.file_in_archive(iter([b"not a tar archive" * 40]))) == []


class Rank0Node(PartialEngine):
    """One node holding rank 0's container of cluster c1, its job log handed out in small chunks; what was read of
    it is counted."""

    def __init__(self, job_log: bytes, status: str | None, running: bool = False) -> None:
        self.node = Node("node_1", "ssh://node_1")
        self.job_log, self.status, self.running = job_log, status, running
        self.chunks_read = 0
        self.followed = False

    def cluster_containers(self, cluster_id=None):
        return [container("c1-node_1", "c1", running=self.running)]

    def read_file(self, container_id, path):
        assert path != JOB_LOG, "the whole job log read at once"
        return self.status if path == JOB_STATUS else None

    def stream_file(self, container_id, path):
        assert path == JOB_LOG
        for chunk in chunked(self.job_log, 4096):
            self.chunks_read += 1
            yield chunk

    def logs(self, container_id):
        yield b"worker: sshd up\n"

    def exec_stream(self, container_id, argv):
        self.followed = True
        return "exec-1", iter([b"followed\n"])


NOISE = b"".join(b"step %d loss 0.1\n" % step for step in range(100_000))  # about 2 MB of output


def test_status_reads_the_jobs_records_never_its_log():
    log = NOISE + b"epoch 5/5: train loss 0.1, val loss 0.2, val accuracy 0.9500, 1234 samples/s, 1.0 s, 2 ranks\n"
    node = Rank0Node(log + b"ValueError: bad batch\n", JobEnd(1, "rank 1 on node_2: ValueError: bad batch").to_json())
    lines = list(clusters.status([node]))
    assert lines[0] == "cluster c1: failed (exit status 1): rank 1 on node_2: ValueError: bad batch"
    running = Rank0Node(log, None, running=True)
    assert list(clusters.status([running]))[0] == f"cluster c1: running: {jobstate.NO_METRICS}"  # no metrics file
    assert node.chunks_read == running.chunks_read == 0


def shown_logs(engines, follow: bool = False, tail: int | None = None) -> bytes:
    own, job, kept = clusters.logs(engines, None, follow, tail, "horovod-stack:latest", "horovod-stack-shared")
    assert kept is None
    return b"".join(chain(own, job))


def test_logs_show_the_whole_output_or_its_last_lines():
    log = b"".join(b"line %d\n" % number for number in range(1, 2001))
    assert shown_logs([Rank0Node(log, JobEnd(0).to_json())]) == b"worker: sshd up\n" + log
    last = shown_logs([Rank0Node(log, JobEnd(0).to_json())], tail=2)
    assert last == b"worker: sshd up\nline 1999\nline 2000\n"


def test_following_a_running_job_streams_from_the_agent_not_the_file():
    node = Rank0Node(b"line\n" * 10_000, None, running=True)
    assert shown_logs([node], follow=True) == b"worker: sshd up\nfollowed\n"
    assert node.followed and node.chunks_read == 0


class EndedNode(PartialEngine):
    """A node whose containers are gone, its shared folder holding run folders (name: (modified, files))."""

    def __init__(self, name: str, runs: dict[str, tuple[int, dict[str, bytes]]]) -> None:
        self.node = Node(name, f"ssh://{name}")
        self.runs = runs
        self.entries_asked = 0

    def cluster_containers(self, cluster_id=None):
        return []

    def list_runs(self, image, shared_dir):
        return [(name, modified) for name, (modified, _) in self.runs.items()]

    def run_entries(self, image, shared_dir, name):
        self.entries_asked += 1
        return sorted(self.runs[name][1])

    def run_archive(self, image, shared_dir, name):
        run, file = name.split("/")
        data = self.runs[run][1][file]
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(file)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        yield from chunked(archive.getvalue(), 1000)


def test_after_the_containers_are_gone_the_newest_runs_kept_output_is_shown_with_a_note():
    log = b"".join(b"[1,%d]<stdout>:epoch %d\n" % (rank, epoch) for epoch in range(1, 400) for rank in (0, 1))
    node_1 = EndedNode("node_1", {"old": (100, {"job.log": b"old\n"})})
    node_2 = EndedNode("node_2", {"c1": (200, {"job.log": log, "summary.json": b"{}"})})
    own, job, kept = clusters.logs([node_1, node_2], None, False, None, "horovod-stack:latest", "horovod-stack-shared")
    assert list(own) == [] and b"".join(job) == log
    assert kept == (
        "the job's containers are gone: its output as run c1 kept it (node_2: runs/c1/job.log in "
        "horovod-stack-shared); the workers' own output went with them"
    )
    _, last, _ = clusters.logs([node_1, node_2], None, False, 1, "horovod-stack:latest", "horovod-stack-shared")
    assert b"".join(last) == b"[1,1]<stdout>:epoch 399\n"


@pytest.mark.parametrize(
    "runs, newest",
    [
        ({}, ""),
        ({"nolog": (300, {"metrics.jsonl": b"{}"}), "old": (100, {"job.log": b"old\n"})},
         " (the newest run, nolog on node_1, kept none)"),
    ],
)  # fmt: skip
def test_with_no_container_and_no_kept_output_logs_say_where_an_ended_jobs_output_goes(runs, newest):
    node = EndedNode("node_1", runs)
    with pytest.raises(clusters.ClusterError) as missing:
        clusters.logs([node], None, False, None, "horovod-stack:latest", "horovod-stack-shared")
    assert str(missing.value) == (
        "node_1: no container of the stack there, and no job's output in the shared folder (horovod-stack-shared)"
        f"{newest}: an ended job's output is kept there as runs/CLUSTER/job.log until that volume is removed "
        "(`launcher results` copies a run folder to this machine)"
    )
    assert node.entries_asked <= 1  # one run's entries at most, however many runs the folder holds
