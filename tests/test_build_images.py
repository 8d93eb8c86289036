"""scripts/build-images.sh picks its path by itself and sets up no host that has an engine.

Against this machine's real engine: a base image that is here means the online path (the Dockerfile's defaults,
pip from its index); one that cannot be pulled, or whose pull hangs, the offline path (local base image, wheel
folder). `--dry-run` stops before the build, so no test here builds an image. The offline wheel folder is filled
for the image's Python (CPython 3.11, manylinux) whatever the host's is: the pip command is read through a
stand-in `python3`, and the folder CI filled is checked wheel by wheel.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

REPO = Path(__file__).resolve().parents[1]
BUILD_IMAGES = REPO / "scripts" / "build-images.sh"
LOCAL_BASE = "horovod-stack-base:bookworm"
WHEELHOUSE = Path("/var/cache/horovod-stack/wheelhouse")


def engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def needs_engine(test):
    """A test against this machine's real engine: an integration test, skipped where no engine answers."""
    return pytest.mark.integration(
        pytest.mark.skipif(not engine_answers(), reason="needs a running Docker engine")(test)
    )


def build_images(*argv: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BUILD_IMAGES), *argv], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


@needs_engine
def test_a_base_image_that_is_here_means_the_online_path_and_no_host_setup():
    if subprocess.run(["docker", "image", "inspect", LOCAL_BASE], capture_output=True).returncode != 0:
        pytest.skip(f"{LOCAL_BASE} is not here (scripts/build-images.sh makes it on the offline path)")
    result = build_images("--dry-run", env={"BASE_IMAGE": LOCAL_BASE})
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"online path: the base image {LOCAL_BASE} is here" in result.stdout
    assert "as it is (no host set-up)" in result.stdout
    assert "[host-setup]" not in result.stdout
    would_build = result.stdout.splitlines()[-1]
    assert f"--build-arg BASE_IMAGE={LOCAL_BASE} --build-arg PIP_OFFLINE=0" in would_build
    assert "wheels=" not in would_build


@needs_engine
def test_a_base_that_cannot_be_pulled_means_the_offline_path(tmp_path):
    result = build_images("--dry-run", env={"BASE_IMAGE": "localhost:1/no-such-base:1", "WHEELHOUSE": str(tmp_path)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "offline path: localhost:1/no-such-base:1 cannot be pulled (" in result.stdout
    assert "connection refused" in result.stdout
    assert (
        f"--build-arg BASE_IMAGE={LOCAL_BASE} --build-arg PIP_OFFLINE=1 --build-context wheels={tmp_path} ."
        in result.stdout
    )


@needs_engine
def test_a_pull_that_hangs_is_bounded_and_means_the_offline_path():
    """A registry that accepts the connection and never answers (a network that drops packets)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    base = f"127.0.0.1:{listener.getsockname()[1]}/silent-base:1"
    try:
        result = build_images("--dry-run", env={"BASE_IMAGE": base, "BASE_PULL_TIMEOUT": "3"}, timeout=60)
    finally:
        stop.set()
        thread.join()
        for connection in [*accepted, listener]:
            connection.close()
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"offline path: pulling {base} got no answer in 3 s" in result.stdout


def stand_in_python(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A PATH whose python3 records each call's arguments (one line each) and succeeds."""
    calls = tmp_path / "calls.txt"
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "python3"
    script.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    script.chmod(0o755)
    return {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}, calls


def test_the_wheel_folder_is_filled_for_the_images_python_once(tmp_path):
    env, calls = stand_in_python(tmp_path)
    wheelhouse = tmp_path / "wheelhouse"
    first = build_images("wheels", env={**env, "WHEELHOUSE": str(wheelhouse)})
    assert first.returncode == 0, first.stdout + first.stderr
    downloads = [line for line in calls.read_text().splitlines() if line.startswith("-m pip download")]
    assert len(downloads) == 2, downloads
    wheels, sdist = downloads
    arch = platform.machine()
    for option in (
        "--only-binary=:all:",
        "--implementation cp",
        "--python-version 3.11",
        "--abi cp311",
        f"--platform manylinux_2_36_{arch}",
        f"--platform manylinux_2_28_{arch}",
        f"--platform manylinux_2_17_{arch}",
        "-r docker/requirements-runtime.txt",
    ):
        assert option in wheels, option
    assert "--platform manylinux_2_37" not in wheels  # Debian 12's glibc is 2.36
    assert sdist.endswith("--no-deps --no-binary :all: horovod==0.28.1")
    assert (tmp_path / "wheelhouse.complete").read_text().strip()
    assert list(wheelhouse.iterdir()) == []  # the key lies beside the folder: a build context's content is the image's

    calls.unlink()
    again = build_images("wheels", env={**env, "WHEELHOUSE": str(wheelhouse)})
    assert again.returncode == 0, again.stderr
    assert "complete" in again.stdout
    assert not calls.exists()


@pytest.mark.integration  # the folder this machine's set-up filled
def test_the_filled_wheel_folder_holds_only_what_the_images_python_installs():
    """The folder CI filled: every wheel installs on CPython 3.11 on Debian 12 (glibc 2.36) on this architecture."""
    if not (WHEELHOUSE.parent / f"{WHEELHOUSE.name}.complete").exists():
        pytest.skip(f"{WHEELHOUSE} is not filled here (the offline path fills it)")
    arch = platform.machine()
    platforms = [f"manylinux_2_{minor}_{arch}" for minor in range(36, 4, -1)]
    platforms += [f"manylinux{legacy}_{arch}" for legacy in ("2014", "2010", "1")]
    installable = {*cpython_tags((3, 11), ["cp311"], platforms), *compatible_tags((3, 11), "cp311", platforms)}
    wheels = sorted(WHEELHOUSE.glob("*.whl"))
    assert any(wheel.name.startswith("torch-2.14.1-") for wheel in wheels)
    foreign = [wheel.name for wheel in wheels if not parse_wheel_filename(wheel.name)[3] & installable]
    assert foreign == []
    assert (WHEELHOUSE / "horovod-0.28.1.tar.gz").exists()


def test_without_an_engine_a_user_is_told_what_to_install_and_nothing_is_set_up():
    """No engine answers and the user is not root: what to install, and scripts/host-setup.sh never runs."""
    with tempfile.TemporaryDirectory() as folder:  # not under pytest's own tmp, which only root may enter
        bin_dir = Path(folder)
        bin_dir.chmod(0o755)
        docker = bin_dir / "docker"
        docker.write_text(
            "#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock.' >&2\nexit 1\n"
        )
        docker.chmod(0o755)
        argv = [str(BUILD_IMAGES), "--dry-run"]
        if os.geteuid() == 0:
            if shutil.which("setpriv") is None:
                pytest.skip("needs setpriv to run as another user")
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
            if subprocess.run([*argv[:4], "test", "-x", str(BUILD_IMAGES)]).returncode != 0:
                pytest.skip("this checkout is not readable by an unprivileged user")
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        )
    assert result.returncode == 1
    assert "docker info: Cannot connect to the Docker daemon" in result.stderr
    assert (
        "install Docker Engine with Compose 2.17 or newer and buildx (https://docs.docker.com/engine/install/"
        in result.stderr
    )
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "[host-setup]" not in result.stdout + result.stderr


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="the engine set-up is offered to root only")
def test_without_an_engine_root_gets_the_engine_set_up(tmp_path):
    (tmp_path / "bin").mkdir()
    docker = tmp_path / "bin" / "docker"
    docker.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    docker.chmod(0o755)
    if shutil.which("apt-get") is None:
        pytest.skip("scripts/host-setup.sh is for Debian hosts")
    result = build_images("--dry-run", env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    assert "would set up the engine (scripts/host-setup.sh engine)" in result.stdout
