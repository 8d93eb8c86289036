"""`launcher results`: which run, and what of its archive lands on this machine (the real engines:
test_launcher_multihost.py)."""

from __future__ import annotations

import io
import tarfile

import pytest

from launcher.host.running.results import Run, choose, extract, fetch
from tests.standins import PartialEngine

RUNS = [Run("a1b2c3d4", "node_1", 100), Run("e5f6a7b8", "node_1", 300), Run("c9d0e1f2", "node_2", 200)]


def test_the_newest_run_or_the_one_asked_for():
    assert choose(RUNS, None).name == "e5f6a7b8"
    assert choose(RUNS, "c9d0e1f2").node == "node_2"
    with pytest.raises(
        ValueError,
        match=r"^no run 0000 in the shared folder of these nodes; the runs there: "
        r"e5f6a7b8 \(node_1\), c9d0e1f2 \(node_2\), a1b2c3d4 \(node_1\)$",
    ):
        choose(RUNS, "0000")
    with pytest.raises(ValueError, match="no run in the shared folder of these nodes yet"):
        choose([], None)


def archive(entries: dict[str, bytes], link: str | None = None, mode: int = 0o644) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
    return buffer.getvalue()


def test_the_run_folder_lands_whole_or_without_its_checkpoints(tmp_path):
    data = archive(
        {"run1/metrics.jsonl": b"{}\n", "run1/checkpoints/epoch-1.pt": b"x", "run1/tb/events": b"e"}, link="run1/passwd"
    )
    assert extract([data[:100], data[100:]], tmp_path / "all") == [
        "run1/checkpoints/epoch-1.pt",
        "run1/metrics.jsonl",
        "run1/tb/events",
    ]
    assert (tmp_path / "all/run1/metrics.jsonl").read_bytes() == b"{}\n"
    assert not (tmp_path / "all/run1/passwd").exists()  # a link is never written
    assert extract([data], tmp_path / "lean", checkpoints=False) == ["run1/metrics.jsonl", "run1/tb/events"]


def test_without_tarfiles_extraction_filters_the_same_files_land_as_plain_data(tmp_path, monkeypatch):
    """Python before 3.11.4 (Debian 12's 3.11.2) has no extract(filter=...): the files land all the same, without
    set-ID bits or write for others, and still no link."""
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    data = archive(
        {"run1/metrics.jsonl": b"{}\n", "run1/checkpoints/epoch-1.pt": b"x", "run1/tb/events": b"e"},
        link="run1/passwd",
        mode=0o4777,
    )
    assert extract([data], tmp_path / "all") == ["run1/checkpoints/epoch-1.pt", "run1/metrics.jsonl", "run1/tb/events"]
    assert (tmp_path / "all/run1/metrics.jsonl").read_bytes() == b"{}\n"
    assert (tmp_path / "all/run1/metrics.jsonl").stat().st_mode & 0o7777 == 0o755
    assert not (tmp_path / "all/run1/passwd").exists()
    assert extract([data], tmp_path / "lean", checkpoints=False) == ["run1/metrics.jsonl", "run1/tb/events"]


def test_the_archive_lands_as_it_arrives_not_once_it_is_whole(tmp_path):
    data = archive({"run1/metrics.jsonl": b"{}\n", "run1/tb/events": b"e" * 1_000_000})
    landed = []

    def chunks():
        for start in range(0, len(data), 4096):
            if start >= 256 * 1024:  # well past metrics.jsonl, and past any read-ahead
                landed.append((tmp_path / "run1/metrics.jsonl").exists())
            yield data[start : start + 4096]

    assert extract(chunks(), tmp_path) == ["run1/metrics.jsonl", "run1/tb/events"]
    assert landed and all(landed)
    assert (tmp_path / "run1/tb/events").read_bytes() == b"e" * 1_000_000


class RunFolders(PartialEngine):
    """A node's shared folder as the engine hands it out: the names in a run folder, and any part of one as docker's
    get_archive makes it (members named from the part's own name); what was asked for is kept."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.asked: list[str] = []

    def run_entries(self, image, shared_dir, name):
        return sorted({path.split("/")[1] for path in self.files if path.startswith(name + "/")})

    def run_archive(self, image, shared_dir, path):
        self.asked.append(path)
        parent = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
        inside = {
            name.removeprefix(parent): data
            for name, data in self.files.items()
            if name == path or name.startswith(path + "/")
        }
        data = archive(inside)
        return iter([data[i : i + 1000] for i in range(0, len(data), 1000)])


RUN_FILES = {
    "run1/metrics.jsonl": b"{}\n",
    "run1/summary.json": b"{}",
    "run1/checkpoints/latest.pt": b"x" * 5000,
    "run1/tb/events": b"e",
}


def test_without_checkpoints_they_are_never_asked_for(tmp_path):
    node = RunFolders(RUN_FILES)
    written = fetch(node, "img", "vol", "run1", tmp_path, checkpoints=False)
    assert written == ["run1/metrics.jsonl", "run1/summary.json", "run1/tb/events"]
    assert sorted(node.asked) == ["run1/metrics.jsonl", "run1/summary.json", "run1/tb"]
    assert (tmp_path / "run1/tb/events").read_bytes() == b"e" and not (tmp_path / "run1/checkpoints").exists()


def test_with_checkpoints_the_folder_comes_in_one_archive(tmp_path):
    node = RunFolders(RUN_FILES)
    written = fetch(node, "img", "vol", "run1", tmp_path, checkpoints=True)
    assert written == ["run1/checkpoints/latest.pt", "run1/metrics.jsonl", "run1/summary.json", "run1/tb/events"]
    assert node.asked == ["run1"]
    assert (tmp_path / "run1/checkpoints/latest.pt").read_bytes() == b"x" * 5000


def test_a_run_of_checkpoints_alone_still_makes_its_folder(tmp_path):
    written = fetch(RunFolders({"run1/checkpoints/latest.pt": b"x"}), "img", "vol", "run1", tmp_path, False)
    assert written == [] and (tmp_path / "run1").is_dir()
