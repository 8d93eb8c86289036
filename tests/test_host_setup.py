"""scripts/host-setup.sh leaves the host its own: apt consistent, no package from another release, idempotent.

The first tests read the real host after setup (scripts/test.sh ran it before pytest); the guard tests feed the
script's plan check apt output through a stand-in `apt-get` on PATH, which is the one unit of our own logic here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

# Every test here needs root, and the first ones the real host after set-up: none is a unit test.
pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
HOST_SETUP = REPO / "scripts" / "host-setup.sh"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="scripts/host-setup.sh runs as root")
needs_apt = pytest.mark.skipif(
    shutil.which("apt-get") is None or os.geteuid() != 0,
    reason="needs a Debian host and root, as scripts/host-setup.sh does",
)


def run(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, **kwargs)


@needs_apt
def test_apt_state_is_consistent_after_setup():
    result = run("apt-get", "check")
    assert result.returncode == 0, result.stdout + result.stderr


@needs_apt
def test_host_core_packages_are_versions_of_the_hosts_own_release():
    """libc, python3 and OpenSSH stay what the host's own apt sources offer (no Debian 13 upgrade)."""
    for package in ("libc6", "python3", "openssh-client", "openssh-server"):
        installed = run("dpkg-query", "-W", "-f=${Version}", package).stdout.strip()
        assert installed, f"{package} is not installed"
        offered = {line.split("|")[1].strip() for line in run("apt-cache", "madison", package).stdout.splitlines()}
        assert installed in offered, f"{package} {installed} is not from this host's apt sources ({offered})"
    sources = run("grep", "-rhs", "trixie", "/etc/apt/sources.list", "/etc/apt/sources.list.d").stdout
    assert sources == "", f"an apt source for another release was added: {sources}"


@needs_apt
def test_second_run_changes_nothing():
    result = run(str(HOST_SETUP), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "installing" not in result.stdout, result.stdout
    assert "engine" in result.stdout


@needs_apt
def test_private_engine_is_unknown_to_dpkg():
    engine_root = Path("/opt/horovod-stack/engine/root/usr/sbin/dockerd")
    if not engine_root.exists():
        pytest.skip("this host had an engine of its own; no private engine was unpacked")
    assert run("dpkg", "-S", str(engine_root)).returncode != 0


def fake_apt_get(tmp_path: Path, simulated_plan: str) -> dict[str, str]:
    """A PATH whose apt-get prints the given `apt-get -s install` plan."""
    (tmp_path / "plan.txt").write_text(simulated_plan)
    script = tmp_path / "apt-get"
    script.write_text(f"#!/bin/sh\ncat {tmp_path / 'plan.txt'}\n")
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}


PLAN_CASES = {
    "a new package only": ("Inst openmpi-bin (4.1.4-3+b1 Debian:12.15/oldstable [amd64])\n", None),
    "a Debian revision of the same upstream version": (
        "Inst openssh-client [1:9.2p1-2+deb12u6] (1:9.2p1-2+deb12u10 Debian:12.15/oldstable [amd64])\n"
        "Inst libevent-core-2.1-7 [2.1.12-stable-8] (2.1.12-stable-8+deb12u1 Debian-Security:12 [amd64])\n",
        None,
    ),
    "another release's libc": (
        "Inst libc6 [2.36-9+deb12u10] (2.41-12 Debian:13.1/stable [amd64])\n",
        "libc6: 2.36-9+deb12u10 -> 2.41-12",
    ),
    "a removal": ("Remv python3.11-venv [3.11.2-6+deb12u6]\n", "python3.11-venv: removed"),
}


@needs_root
@pytest.mark.parametrize("case", PLAN_CASES, ids=list(PLAN_CASES))
def test_plan_guard(tmp_path, case):
    plan, refused_line = PLAN_CASES[case]
    result = run(str(HOST_SETUP), "check-plan", "somepackage", env=fake_apt_get(tmp_path, plan))
    if refused_line is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == 1
        assert refused_line in result.stderr
        assert "HOROVOD_STACK_ALLOW_HOST_CHANGES=1" in result.stderr


@needs_root
def test_plan_guard_can_be_overridden(tmp_path):
    env = fake_apt_get(tmp_path, PLAN_CASES["a removal"][0])
    result = run(str(HOST_SETUP), "check-plan", "x", env={**env, "HOROVOD_STACK_ALLOW_HOST_CHANGES": "1"})
    assert result.returncode == 0, result.stderr
