"""--workdir: only regular files and folders travel, secrets and .launcherignore's entries stay behind and are named,
and the size check counts exactly what is copied."""

import io
import os
import socket
import stat
import tarfile

import pytest

from launcher.core.options import SettingsError
from launcher.host.planning import workdir
from launcher.host.planning.workdir import Skip
from tests.conftest import launch_settings


def members(archive: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {member.name: member for member in tar.getmembers()}


@pytest.mark.parametrize(
    "patterns, path, is_dir, expected",
    [
        ("data", "data", True, True),
        ("data", "src/data", True, True),  # a name alone matches at any depth
        ("data", "data", False, True),
        ("data/", "data", False, False),  # a trailing / is for folders only
        ("data/", "src/data", True, True),
        ("/build", "build", True, True),
        ("/build", "src/build", True, False),  # a leading / anchors to the top
        ("docs/*.md", "docs/a.md", False, True),
        ("docs/*.md", "docs/sub/a.md", False, False),  # * stays within a folder
        ("docs/*.md", "x/docs/a.md", False, False),  # a / inside anchors too
        ("*.ckpt", "runs/7/model.ckpt", False, True),
        ("**/logs", "logs", True, True),
        ("**/logs", "a/b/logs", True, True),
        ("a/**/b", "a/b", False, True),
        ("a/**/b", "a/x/y/b", False, True),
        ("out/**", "out/x/y", False, True),
        ("out/**", "out/x", True, True),
        ("model?.pt", "model1.pt", False, True),
        ("model?.pt", "model10.pt", False, False),
        ("model[0-9].pt", "model3.pt", False, True),
        ("model[!0-9].pt", "model3.pt", False, False),
        ("*.ckpt\n!best.ckpt", "best.ckpt", False, False),  # the last rule that matches decides
        ("!best.ckpt\n*.ckpt", "best.ckpt", False, True),
        ("# a comment\n\n   \n*.log", "# a comment", False, False),
        ("\\#notes", "#notes", False, True),
        ("\\!important", "!important", False, True),
        ("weights.bin   ", "weights.bin", False, True),  # trailing spaces are not part of the pattern
        ("a.b", "axb", False, False),  # a dot is a dot
    ],
)
def test_launcherignore_patterns(patterns, path, is_dir, expected):
    assert workdir.ignored(workdir.parse_ignore(patterns), path, is_dir) is expected


@pytest.mark.parametrize(
    "name, is_dir, secret",
    [
        (".env", False, True),
        (".env.local", False, True),
        (".env.example", False, True),
        (".envrc", False, False),
        ("env.py", False, False),
        (".ssh", True, True),
        (".ssh", False, False),
        ("server.pem", False, True),
        ("id_rsa.key", False, True),
        ("id_rsa", False, True),
        ("id_ed25519", False, True),
        ("id_ed25519.pub", False, False),
        ("keys.py", False, False),
    ],
)
def test_secrets_by_name(name, is_dir, secret):
    assert workdir.is_secret(name, is_dir) is secret


@pytest.mark.parametrize(
    "mode, kind",
    [
        (stat.S_IFREG | 0o644, None),
        (stat.S_IFDIR | 0o755, None),
        (stat.S_IFLNK | 0o777, "symlink"),
        (stat.S_IFIFO | 0o600, "FIFO"),
        (stat.S_IFSOCK | 0o600, "socket"),
        (stat.S_IFCHR | 0o600, "device node"),
        (stat.S_IFBLK | 0o600, "device node"),
    ],
)
def test_only_regular_files_and_folders_travel(mode, kind):
    assert workdir.special_kind(mode) == kind


@pytest.mark.parametrize(
    "skipped, line",
    [
        ([], None),
        ([Skip(".env", "secrets")], "skipped .env (secrets)"),
        (
            [
                Skip(".env", "secrets"),
                Skip(".ssh/", "secrets"),
                Skip("id_rsa.key", "secrets"),
                Skip("data/", ".launcherignore"),
                Skip("a", "symlink"),
                Skip("b", "symlink"),
            ],
            "skipped .env, .ssh/, id_rsa.key, data/ (secrets, .launcherignore) and 2 symlinks",
        ),
        ([Skip("a", "symlink"), Skip("f", "FIFO"), Skip("s", "socket")], "skipped 1 symlink, 1 FIFO and 1 socket"),
        (
            [Skip(f"k{i}.pem", "secrets") for i in range(10)],
            "skipped k0.pem, k1.pem, k2.pem, k3.pem, k4.pem, k5.pem, k6.pem, k7.pem, +2 more (secrets)",
        ),
    ],
)
def test_what_stayed_behind_is_one_line(skipped, line):
    assert workdir.skipped_line(skipped) == line


@pytest.fixture
def code(tmp_path):
    """A code folder with secrets, links, a FIFO, caches and a .launcherignore."""
    folder = tmp_path / "code"
    (folder / "pkg" / "__pycache__").mkdir(parents=True)
    (folder / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"0")
    (folder / "pkg" / "model.py").write_text("x = 1\n")
    (folder / "train.py").write_text("print(1)\n")
    os.chmod(folder / "train.py", 0o4755)  # set-user-ID: dropped in the archive
    (folder / ".env").write_text("TOKEN=secret\n")
    (folder / ".env.local").write_text("TOKEN=secret\n")
    (folder / ".ssh").mkdir()
    (folder / ".ssh" / "id_ed25519").write_text("PRIVATE\n")
    (folder / "pkg" / "tls.pem").write_text("PRIVATE\n")
    (folder / "id_rsa.key").write_text("PRIVATE\n")
    (folder / "data").mkdir()
    (folder / "data" / "big.bin").write_bytes(b"0" * 4096)
    (folder / "runs").mkdir()
    (folder / "runs" / "a.ckpt").write_bytes(b"0" * 100)
    (folder / "runs" / "best.ckpt").write_bytes(b"0" * 10)
    (folder / ".launcherignore").write_text("# what stays here\ndata/\n*.ckpt\n!best.ckpt\n")
    (folder / "passwd").symlink_to("/etc/passwd")
    (folder / "etc").symlink_to("/etc", target_is_directory=True)
    os.mkfifo(folder / "pipe")
    os.link(folder / ".env", folder / "settings.txt")  # a hard link: copied as a plain file, never as a link
    return folder


def test_the_archive_holds_regular_files_and_folders_only_owned_by_mpiuser(code):
    packed = workdir.pack(code)
    found = members(packed.archive)
    assert sorted(found) == [
        ".launcherignore",
        "pkg",
        "pkg/model.py",
        "runs",
        "runs/best.ckpt",
        "settings.txt",
        "train.py",
    ]
    assert all(member.isfile() or member.isdir() for member in found.values())
    assert {member.uid for member in found.values()} == {1000} and {m.gid for m in found.values()} == {1000}
    assert found["train.py"].mode == 0o755
    assert sum(member.size for member in found.values() if member.isfile()) == workdir.payload_bytes(code)


def test_what_stayed_behind_is_named_with_why(code):
    packed = workdir.pack(code)
    assert sorted(packed.skipped, key=lambda skip: skip.path) == [
        Skip(".env", "secrets"),
        Skip(".env.local", "secrets"),
        Skip(".ssh/", "secrets"),
        Skip("data/", ".launcherignore"),
        Skip("etc", "symlink"),
        Skip("id_rsa.key", "secrets"),
        Skip("passwd", "symlink"),
        Skip("pipe", "FIFO"),
        Skip("pkg/tls.pem", "secrets"),
        Skip("runs/a.ckpt", ".launcherignore"),
    ]
    assert workdir.skipped_line(packed.skipped) == (
        "skipped .env, .env.local, .ssh/, data/, id_rsa.key, pkg/tls.pem, runs/a.ckpt (secrets, .launcherignore), "
        "2 symlinks and 1 FIFO"
    )


def test_a_socket_stays_behind(tmp_path):
    folder = tmp_path / "s"
    folder.mkdir()
    server = socket.socket(socket.AF_UNIX)
    cwd = os.getcwd()
    os.chdir(folder)  # a relative name: socket paths are short
    try:
        server.bind("sock")
    finally:
        os.chdir(cwd)
        server.close()
    assert workdir.pack(folder).skipped == (Skip("sock", "socket"),)
    assert workdir.payload_bytes(folder) == 0


def test_the_size_check_counts_only_what_travels(tmp_path, monkeypatch):
    monkeypatch.setattr("launcher.host.planning.settings.WORKDIR_LIMIT_BYTES", 1000)
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.bin").write_bytes(b"0" * 5000)
    with pytest.raises(SettingsError, match="more than the 0 MB"):
        launch_settings(nodes=("node_1",), workdir=tmp_path)
    (tmp_path / ".launcherignore").write_text("/data/\n")
    launch_settings(nodes=("node_1",), workdir=tmp_path)


def test_a_bad_launcherignore_line_is_one_line_naming_it(tmp_path):
    (tmp_path / ".launcherignore").write_text("*.log\nmodel[z-a].pt\n")
    with pytest.raises(SettingsError) as refused:
        launch_settings(nodes=("node_1",), workdir=tmp_path)
    message = str(refused.value)
    assert message.startswith(
        f"--workdir {tmp_path}: {tmp_path / '.launcherignore'} line 2: 'model[z-a].pt' is not a pattern"
    )
    assert message.endswith("fix or remove the line") and "\n" not in message
