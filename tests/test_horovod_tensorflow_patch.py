"""docker/patch-horovod-tensorflow.sh over Horovod 0.28.1's own sdist: what a GPU build against TensorFlow 2.21 needs
is there after one run (the stream through platform_specific_handle(), no static cudart, the RUNPATH to its NCCL
wheel, no XLA ops), a second run changes nothing, and a source it does not know stops the build in one line naming
the file. The build itself and the library it makes: tests/test_tensorflow_gpu_build.py."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the sdist: the offline build's wheel folder has it, else pip downloads it

REPO = Path(__file__).resolve().parent.parent
PATCHES = (REPO / "docker" / "patch-horovod-source.sh", REPO / "docker" / "patch-horovod-tensorflow.sh")
SDIST = "horovod-0.28.1.tar.gz"
WHEEL_FOLDERS = ("/var/cache/horovod-stack/wheelhouse-tensorflow", "/var/cache/horovod-stack/wheelhouse")


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    for folder in (os.environ.get("HOROVOD_SDIST_DIR", ""), *WHEEL_FOLDERS):
        if folder and (Path(folder) / SDIST).is_file():
            return Path(folder) / SDIST
    into = tmp_path_factory.mktemp("sdist")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    "horovod==0.28.1", "-d", str(into)], check=True)  # fmt: skip
    return into / SDIST


def unpacked(sdist: Path, into: Path) -> Path:
    with tarfile.open(sdist) as archive:
        archive.extractall(into, filter="data")
    return into / "horovod-0.28.1"


def patch(source: Path, script: Path = PATCHES[1]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(script), str(source)], capture_output=True, text=True)


def tree_digest(source: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(source.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture
def source(sdist, tmp_path) -> Path:
    src = unpacked(sdist, tmp_path)
    done = patch(src, PATCHES[0])
    assert done.returncode == 0, done.stderr
    return src


def test_one_run_makes_the_gpu_build_and_a_second_changes_nothing(source):
    done = patch(source)
    assert done.returncode == 0, done.stderr
    ops = (source / "horovod/tensorflow/mpi_ops.cc").read_text()
    assert "AsGpuStreamValue" not in ops  # Horovod's own declaration of a symbol TF 2.21 no longer exports
    assert ops.count("HorovodStackGpuStream(device_context->stream())") == 8, "the one-line calls"
    assert ops.count("HorovodStackGpuStream(\n") == 4, "the calls that span two lines"
    assert "stream->platform_specific_handle().stream" in ops
    cmake = (source / "CMakeLists.txt").read_text()
    assert 'set(CMAKE_CUDA_RUNTIME_LIBRARY "Shared")' in cmake and '"Static")' not in cmake
    tf_cmake = (source / "horovod/tensorflow/CMakeLists.txt").read_text()
    assert (
        'BUILD_WITH_INSTALL_RPATH TRUE\n                      INSTALL_RPATH "$ORIGIN/../../nvidia/nccl/lib")'
        in tf_cmake
    )
    xla = (source / "horovod/tensorflow/xla_mpi_ops.cc").read_text()
    assert (
        "\n#if 0  // horovod-stack: XLA ops not built" in xla and "\n#if TENSORFLOW_VERSION >= 2006000000\n" not in xla
    )

    first = tree_digest(source)
    again = patch(source)
    assert again.returncode == 0, again.stderr
    assert tree_digest(source) == first


@pytest.mark.parametrize(
    "path, edit",
    [
        # a Horovod whose GPU stream calls changed (one more, as a newer mpi_ops.cc could have)
        ("horovod/tensorflow/mpi_ops.cc", lambda text: text + "\n// stream_executor::gpu::AsGpuStreamValue(x)\n"),
        # a CMakeLists whose runtime default line moved
        ("CMakeLists.txt", lambda text: text.replace('set(CMAKE_CUDA_RUNTIME_LIBRARY "Static")', "set(X Static)")),
    ],
)
def test_a_source_it_does_not_know_stops_the_build_in_one_line_naming_the_file(source, path, edit):
    target = source / path
    target.write_text(edit(target.read_text()))
    done = patch(source)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("patch-horovod-tensorflow: "), done.stderr
    assert str(target) in lines[0], lines[0]
