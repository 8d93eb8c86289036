#!/usr/bin/env bash
# Builds the Horovod wheel (cpu ops) with another GCC in a throwaway container, to check the recipe's source
# fixes (docker/patch-horovod-source.sh) against newer compilers:
#   scripts/check-horovod-gcc.sh [13|14]        (default 14)
# The container starts from the local base image (Debian 12, Python 3.11, so the wheel folder's torch fits) and
# gets g++-N from Debian 13's archive, inside the container only; the host is untouched. Prints the build time.
# Needs what scripts/build-images.sh makes on its offline path: the base image and the wheel folder.
set -euo pipefail
cd "$(dirname "$0")/.."
gcc_version="${1:-14}"
BASE_IMAGE="${BASE_IMAGE:-horovod-stack-base:bookworm}"
WHEELHOUSE="${WHEELHOUSE:-/var/cache/horovod-stack/wheelhouse}"
mirror=$(scripts/host-setup.sh mirror)

docker run --rm -e "GCC_VERSION=$gcc_version" -e "MIRROR=$mirror" \
  -v "$PWD/docker:/recipe:ro" -v "$WHEELHOUSE:/wheels:ro" "$BASE_IMAGE" bash -euo pipefail -c '
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends python3-venv python3-dev openmpi-bin libopenmpi-dev make >/dev/null
    echo "deb $MIRROR trixie main" > /etc/apt/sources.list.d/trixie.list
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends -t trixie "g++-$GCC_VERSION" >/dev/null
    export CC="gcc-$GCC_VERSION" CXX="g++-$GCC_VERSION" CUDAHOSTCXX="g++-$GCC_VERSION"
    $CXX --version | head -1
    python3 -m venv /venv && export PATH=/venv/bin:$PATH
    /venv/bin/pip install -q --no-index --find-links /wheels -r /recipe/requirements-runtime.txt \
      -r /recipe/requirements-build.txt -r /recipe/requirements-cuda-toolkit.txt
    started=$(date +%s)
    PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels PYTHON=/venv/bin/python HOROVOD_WHEEL_CACHE=/tmp/wheels \
      /recipe/install-horovod.sh cpu
    echo "[check-horovod-gcc] Horovod built with $($CXX --version | head -1) in $(( $(date +%s) - started )) s"
    /venv/bin/horovodrun --check-build | grep -E "\[X\] (PyTorch|MPI|Gloo)"
  '
