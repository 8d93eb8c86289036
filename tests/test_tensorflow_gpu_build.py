"""horovod-stack:tensorflow's Horovod is a GPU build against TensorFlow 2.21, checked in the image on this GPU-less,
driver-less machine: NCCL, MPI and Gloo ops; the TensorFlow library loads, asks for no symbol TensorFlow lacks, and
uses the cudart and NCCL of TensorFlow's own wheels (one of each in a rank); the CUDA compiler stayed in the build
stage and no NVIDIA driver library entered the image. What could not run here: anything on a GPU
(scripts/gpu-check-tensorflow.sh on a GPU host)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from app.frameworks import TENSORFLOW

pytestmark = pytest.mark.integration

TF_IMAGE = os.environ.get("TENSORFLOW_IMAGE", TENSORFLOW.image)
SITE = "/opt/venv/lib/python3.11/site-packages"
LIBRARY = "horovod/tensorflow/mpi_lib.cpython-311-x86_64-linux-gnu.so"


def in_image(script: str, timeout: float = 180) -> str:
    argv = ["docker", "run", "--rm", "--user", "1000:1000", "--entrypoint", "bash", TF_IMAGE, "-c", script]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    """Horovod's TensorFlow library, copied out of the image (the image has no binutils)."""
    into = tmp_path_factory.mktemp("lib")
    container = subprocess.run(["docker", "create", TF_IMAGE], capture_output=True, text=True, check=True).stdout
    try:
        subprocess.run(["docker", "cp", f"{container.strip()}:{SITE}/{LIBRARY}", str(into)], check=True)
    finally:
        subprocess.run(["docker", "rm", container.strip()], capture_output=True)
    return into / Path(LIBRARY).name


def test_check_build_lists_nccl_mpi_and_gloo_ops_for_tensorflow():
    out = in_image(
        "horovodrun --check-build && python -c 'import horovod.tensorflow as hvd; "
        'print("nccl_built", hvd.nccl_built(), "mpi_built", hvd.mpi_built(), "gloo_built", hvd.gloo_built())\''
    )
    print(out)
    ops = out.split("Available Tensor Operations:")[1]
    for op in ("NCCL", "MPI", "Gloo"):
        assert f"[X] {op}" in ops, ops
    assert re.search(r"nccl_built [1-9]\d* mpi_built True gloo_built True", out), out


def test_the_library_asks_only_for_what_tensorflow_and_its_wheels_export(library):
    """Horovod 0.28.1 declared stream_executor::gpu::AsGpuStreamValue itself; TensorFlow 2.21 exports none, so an
    unpatched GPU build compiled and then failed at `import horovod.tensorflow`."""
    assert shutil.which("nm") and shutil.which("readelf"), "binutils (scripts/setup.sh installs a compiler)"
    undefined = subprocess.run(["nm", "-D", "--undefined-only", "-C", str(library)], capture_output=True,
                               text=True, check=True).stdout  # fmt: skip
    assert "AsGpuStreamValue" not in undefined
    defined = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    assert "cudaStreamWaitEvent" in undefined and " cudaStreamWaitEvent" not in defined, (
        "its CUDA calls go to the runtime TensorFlow exports, not a static cudart of its own"
    )
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic)
    assert "libtensorflow_framework.so.2" in needed and "libnccl.so.2" in needed, needed
    assert not any(name.startswith("libcuda.so") for name in needed), "the driver's library is never linked"
    runpath = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.+?)\]", dynamic)
    assert runpath == ["$ORIGIN/../../nvidia/nccl/lib"], dynamic


def test_a_rank_holds_one_nccl_and_one_cudart_the_ones_tensorflow_loads():
    """`import horovod.tensorflow` and hvd.init() with no GPU and no driver: the library loads, and the process maps
    one libnccl and one libcudart, both from TensorFlow's own wheels."""
    out = in_image(
        "python - <<'EOF'\n"
        "import tensorflow as tf, horovod.tensorflow as hvd\n"
        "hvd.init()\n"
        "print('sum', hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum).numpy().tolist())\n"
        "for name in ('libnccl', 'libcudart'):\n"
        "    print(name, sorted({line.split()[-1] for line in open('/proc/self/maps') if '/' + name in line}))\n"
        "EOF"
    )
    print(out)
    assert "sum [1.0, 2.0]" in out
    assert f"libnccl ['{SITE}/nvidia/nccl/lib/libnccl.so.2']" in out, out
    assert f"libcudart ['{SITE}/nvidia/cuda_runtime/lib/libcudart.so.12']" in out, out


def test_the_cuda_compiler_stayed_in_the_build_stage_and_no_driver_library_entered():
    """Neither Debian's nvcc 12.4 (nvcc, cicc, its profile), the build's CUDA folder nor the 12.4 header wheels
    (docker/cuda-toolkit-12.sh) are in the image, nor the driver's libcuda (the NVIDIA Container Toolkit mounts the
    host's). TensorFlow's own CUDA wheels stay: they are what it runs on."""
    out = in_image(
        "find / -xdev \\( -name nvcc -o -name cicc -o -name 'libcuda.so*' -o -name nvcc.profile -o -name cuda-12 "
        "-o -name 'nvidia_cuda_*-12.4.*' \\) -print 2>/dev/null; echo done"
    )
    assert out.strip() == "done", out
