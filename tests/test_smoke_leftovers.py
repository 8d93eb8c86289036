"""launcher/smoke/leftovers.py on this machine: the bits a rank set in the checkout are cleared (those there before
stay), and every process the ranks left, detached or not, is killed before the report is written. In the image, as
the smoke role runs: tests/test_smoke.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from launcher.smoke import leftovers

REPO = Path(__file__).resolve().parents[1]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_bits_a_rank_set_are_cleared_and_those_there_before_stay(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o2775)  # a group folder, setgid before the run: the user's, kept
    before = leftovers.with_special_bits(tmp_path)
    assert before == {shared}

    shell = tmp_path / "sub" / "s"
    shell.parent.mkdir()
    shell.write_bytes(b"\x7fELF")
    os.chmod(shell, 0o6755)
    os.chmod(tmp_path, 0o2755)
    (tmp_path / "link").symlink_to(shell)
    cleared = leftovers.clear_new_special_bits(tmp_path, before)

    assert cleared == [tmp_path, shell]
    assert (mode(tmp_path), mode(shell), mode(shared)) == (0o755, 0o755, 0o2775)
    assert leftovers.with_special_bits(tmp_path) == {shared}
    assert leftovers.cleared_line(tmp_path, cleared) == (
        f"smoke: cleared the setuid/setgid bits the ranks set on 2 path(s) in {tmp_path}: ., sub/s (a setuid file in "
        "a checkout runs as its owner for anyone who can reach it)"
    )


@pytest.mark.skipif(sys.platform != "linux", reason="prctl and /proc are Linux's")
def test_a_detached_leftover_comes_to_the_harness_and_is_killed(tmp_path):
    """A rank that starts a detached child (its own session, its parent gone) and ends: the child is reparented to
    the harness, a subreaper, and killed with the rest; afterwards nothing of it runs."""
    marker = tmp_path / "late"
    script = textwrap.dedent(f"""
        import subprocess, sys, time
        from launcher.smoke import leftovers
        assert leftovers.become_subreaper()
        subprocess.run(["sh", "-c", "setsid sh -c 'sleep 3; touch {marker}' & exit 0"], check=True)
        time.sleep(0.5)
        left = leftovers.children(__import__("os").getpid())
        print(len(left), leftovers.kill_leftovers(), len(leftovers.children(__import__("os").getpid())))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    orphans, killed, left = map(int, done.stdout.split())
    assert (orphans, left) == (1, 0) and killed >= 2, done.stdout  # the orphan came to the harness; it and its sleep
    # were killed; none is left
    subprocess.run(["sleep", "4"])
    assert not marker.exists()
