#!/usr/bin/env bash
# Builds (once) and installs the Horovod wheel this stack runs on; the host's .venv and the images use
# this same recipe. The framework is the one the environment holds: PyTorch (the image horovod-stack:latest, the
# host's .venv) or TensorFlow (horovod-stack:tensorflow; its fixes: patch-horovod-tensorflow.sh).
#
#   docker/install-horovod.sh cpu|gpu
#
# Horovod 0.28.1 (the newest release) does not build as published against today's PyTorch and CMake:
#   - it compiles its C++ (and the torch extension) as C++14, but torch 2.14's headers need C++20
#     (std::strong_ordering in c10/util/intrusive_ptr.h);
#   - its bundled gloo asks for cmake_minimum_required < 3.5, which CMake >= 4 refuses unless
#     CMAKE_POLICY_VERSION_MINIMUM is set.
# patch-horovod-source.sh applies the first fix to the unpacked sdist and this script exports the second,
# then builds a wheel for the ops asked for: cpu = MPI + Gloo, gpu = NCCL + MPI + Gloo (a NCCL build also
# runs MPI and Gloo on CPUs). Against a CUDA build of torch (the one PyPI serves) Horovod compiles its
# CUDA glue even for cpu ops, so a CUDA toolkit is found, or installed from NVIDIA's wheels, either way. Against
# TensorFlow (CUDA 12 wheels) gpu ops compile with the CUDA 12 folder cuda-toolkit-12.sh assembles for the build
# alone, and link the NCCL of TensorFlow's own wheel.
#
# The wheel is cached outside the checkout under $HOROVOD_WHEEL_CACHE, keyed by everything that changes
# it: Horovod version, the patches (patch-horovod-source.sh, patch-horovod-tensorflow.sh), TensorFlow's CUDA 12
# folder's pins, the framework and its version, Python and ops. A run with the same key installs in seconds.
#
# Environment:
#   PYTHON                 interpreter whose environment gets Horovod (default: python3); torch or tensorflow
#                          must already be installed there, since the build compiles against it.
#   HOROVOD_VERSION        default 0.28.1
#   HOROVOD_WHEEL_CACHE    default /var/cache/horovod-stack/wheels
#   HOROVOD_WHEEL_EXPORT   also copy the wheel into this folder
#   HOROVOD_CUDA_HOME      a CUDA toolkit; default /usr/local/cuda where its major version is torch's, else
#                          the toolkit from NVIDIA's PyPI wheels (installed next to torch if missing); for
#                          TensorFlow, cuda-toolkit-12.sh's folder (its pieces from CUDA_TOOLKIT_SOURCES, else fetched).
#   HOROVOD_BUILD_CUDA_CC_LIST  the kernels' GPU architectures (TensorFlow's default: 60,70,75,80,86,89,90).
set -euo pipefail

ops="${1:-}"
case "$ops" in
  cpu|gpu) ;;
  *) echo "usage: $0 cpu|gpu   (cpu = MPI + Gloo ops; gpu = NCCL + MPI + Gloo ops)" >&2; exit 2 ;;
esac

PYTHON="${PYTHON:-python3}"
HOROVOD_VERSION="${HOROVOD_VERSION:-0.28.1}"
cache_root="${HOROVOD_WHEEL_CACHE:-/var/cache/horovod-stack/wheels}"
log() { echo "[install-horovod] $*" >&2; }

if framework_version=$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
  framework=torch
  torch_cuda=$("$PYTHON" -c 'import torch; print(torch.version.cuda or "")')
elif framework_version=$("$PYTHON" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null); then
  framework=tensorflow
  torch_cuda=""
else
  echo "install-horovod: neither torch nor tensorflow is importable by $PYTHON; install one first (the build" \
    "compiles against it)." >&2
  exit 1
fi
py_tag=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
patches=("$here/patch-horovod-source.sh")
[ "$framework" = torch ] || patches+=("$here/patch-horovod-$framework.sh")
# TensorFlow's GPU build compiles with the CUDA 12 folder cuda-toolkit-12.sh makes: its pins key the wheel too.
[ "$framework:$ops" != tensorflow:gpu ] || patches+=("$here/cuda-toolkit-12.sh" "$here/requirements-cuda12-toolkit.txt")
patch_hash=$(cat "${patches[@]}" | sha256sum | cut -c1-16)
key=$(printf '%s\n' "horovod=$HOROVOD_VERSION" "$framework=$framework_version" "python=$py_tag" "ops=$ops" \
      "patch=$patch_hash" | sha256sum | cut -c1-16)
cache_dir="$cache_root/horovod-$HOROVOD_VERSION-$ops-$key"

site_packages=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

prepare_cuda_toolkit() {
  # A CUDA build of torch makes Horovod compile its CUDA glue whatever ops are asked for, so it needs a
  # toolkit's headers and cudart even for cpu ops.
  local cuda_home="${HOROVOD_CUDA_HOME:-}"
  if [ "$framework" = tensorflow ]; then
    # TensorFlow's wheels are CUDA 12 builds; PyPI has no whole CUDA 12 nvcc: cuda-toolkit-12.sh assembles one in
    # the build's own folder (Debian's nvcc 12.4, PyPI's 12.4 headers, TensorFlow's own cudart), gone after it.
    if [ -z "$cuda_home" ]; then
      cuda_home="$1/cuda-12"
      "$here/cuda-toolkit-12.sh" make "$cuda_home" "$site_packages"
    fi
    # Horovod's kernels for TensorFlow 2.21's GPUs (compute capability 6.0 and newer; app/gpu.py's TENSORFLOW_BUILD),
    # with PTX for 9.0 that newer GPUs compile at load; Horovod's default is every architecture nvcc knows.
    export HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-60,70,75,80,86,89,90}"
  fi
  if [ -z "$cuda_home" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
    # Only a toolkit of torch's own CUDA major version (a CUDA 12 toolkit under a CUDA 13 torch does not build).
    local system_cuda
    system_cuda=$(/usr/local/cuda/bin/nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
    if [ "$system_cuda" = "${torch_cuda%%.*}" ]; then
      cuda_home=/usr/local/cuda
    else
      log "/usr/local/cuda is CUDA ${system_cuda:-unknown}, torch is built for CUDA $torch_cuda: not using it"
    fi
  fi
  if [ -z "$cuda_home" ]; then
    cuda_home="$site_packages/nvidia/cu13"
    if [ ! -x "$cuda_home/bin/nvcc" ]; then
      log "no CUDA toolkit found; installing nvcc from NVIDIA's wheels"
      "$PYTHON" -m pip install -q -r "$here/requirements-cuda-toolkit.txt"
    fi
    ln -sf libcudart.so.13 "$cuda_home/lib/libcudart.so"
    [ -e "$cuda_home/lib64" ] || ln -s lib "$cuda_home/lib64"
  fi
  export HOROVOD_CUDA_HOME="$cuda_home" CUDAToolkit_ROOT="$cuda_home" CUDA_HOME="$cuda_home"
  export PATH="$cuda_home/bin:$PATH"
}

prepare_nccl() {
  # One NCCL in the process: build against the NCCL wheel that the framework itself loads.
  local nccl_home="$site_packages/nvidia/nccl"
  if [ ! -f "$nccl_home/include/nccl.h" ]; then
    echo "install-horovod: no NCCL next to $framework ($nccl_home); gpu ops need its CUDA build's NCCL wheel" \
      "(torch: nvidia-nccl-cu13; tensorflow[and-cuda]: nvidia-nccl-cu12)." >&2
    exit 1
  fi
  # The wheel carries only libnccl.so.2; the linker looks for libnccl.so.
  ln -sf libnccl.so.2 "$nccl_home/lib/libnccl.so"
  export HOROVOD_NCCL_HOME="$nccl_home" HOROVOD_GPU_OPERATIONS=NCCL
}

build_wheel() {
  local work
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  log "building horovod $HOROVOD_VERSION ($ops ops) against $framework $framework_version; this takes minutes"
  "$PYTHON" -m pip download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work"
  tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
  local src="$work/horovod-$HOROVOD_VERSION"

  "$here/patch-horovod-source.sh" "$src"
  export CMAKE_POLICY_VERSION_MINIMUM=3.5

  export HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_MXNET=1
  if [ "$framework" = tensorflow ]; then
    "$here/patch-horovod-tensorflow.sh" "$src"  # applied after patch-horovod-source.sh
    export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1
  else
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1
  fi
  if [ -n "$torch_cuda" ] || [ "$ops" = gpu ]; then prepare_cuda_toolkit "$work"; fi
  if [ "$ops" = gpu ]; then prepare_nccl; fi
  export MAKEFLAGS="-j$(nproc)"

  local start=$SECONDS
  "$PYTHON" -m pip wheel -q --no-build-isolation --no-deps "$src" -w "$work/out"
  log "built in $((SECONDS - start)) s"

  # Publish atomically: a build cut short never leaves a half-written wheel in the cache.
  mkdir -p "$cache_root"
  local staging
  staging=$(mktemp -d "$cache_root/.staging.XXXXXX")
  cp "$work"/out/horovod-*.whl "$staging/"
  rm -rf "$cache_dir"
  mv "$staging" "$cache_dir"
}

installed_marker="$site_packages/.horovod-stack-build-key"
export_wheel() {
  # HOROVOD_WHEEL_EXPORT=DIR also copies the wheel there (the image's build stage hands it on this way).
  if [ -n "${HOROVOD_WHEEL_EXPORT:-}" ]; then
    mkdir -p "$HOROVOD_WHEEL_EXPORT"
    cp "$cache_dir"/horovod-*.whl "$HOROVOD_WHEEL_EXPORT/"
  fi
}

if [ "$(cat "$installed_marker" 2>/dev/null)" = "$key" ] && "$PYTHON" -c "import horovod.$framework" 2>/dev/null; then
  log "horovod $HOROVOD_VERSION ($ops ops) already installed from this recipe"
  export_wheel
  exit 0
fi
if ! ls "$cache_dir"/horovod-*.whl >/dev/null 2>&1; then
  build_wheel
else
  log "using cached wheel $cache_dir"
fi
"$PYTHON" -m pip install -q --force-reinstall --no-deps "$cache_dir"/horovod-*.whl
# Then the wheel's own dependencies (--force-reinstall with them would reinstall them all).
"$PYTHON" -m pip install -q "$cache_dir"/horovod-*.whl
echo "$key" > "$installed_marker"
export_wheel
log "installed: $(ls "$cache_dir"/horovod-*.whl)"
