#!/usr/bin/env bash
# Builds the stack's images on this machine, registry or not:
#   scripts/build-images.sh              -> horovod-stack:latest, PyTorch (IMAGE overrides the tag)
#   scripts/build-images.sh tensorflow   -> horovod-stack:tensorflow, TensorFlow (TENSORFLOW_IMAGE overrides the tag;
#                                           the Dockerfile's `tensorflow` target, a wheel folder of its own)
#   scripts/build-images.sh [tensorflow] --dry-run  -> the engine check and the path it picks, and why; builds nothing
#   scripts/build-images.sh [tensorflow] wheels     -> only fills the offline path's wheel folder (WHEELHOUSE)
# It picks one of the Dockerfile's two paths by itself (BUILD_PATH=online or offline forces one):
#   online   where the public base image (BASE_IMAGE, default debian:bookworm-slim, the Dockerfile's own default)
#            is here or can be pulled: the Dockerfile's defaults, pip from its index; nothing on the host changes.
#   offline  where it cannot be pulled (no registry, as on this project's CI machines): a local Debian 12 base
#            image made from the host's apt mirror (scripts/build-base-image.sh; root, once), and a wheel folder
#            (WHEELHOUSE) filled once with wheels for the image's Python (CPython 3.11, manylinux, the engine's
#            architecture) whatever the host's Python is, plus the Horovod sdist; the build then needs no index.
# A Docker engine that answers, with Compose v2 and buildx, is used as it is; only where none does is one set up
# (scripts/host-setup.sh engine: Debian 12, root; any other host is told in one line to install Docker Engine).
# Either way this machine's CA bundle (CA_BUNDLE), if any, reaches pip as a build secret, mounted for pip's steps
# only and never stored in a layer. Rebuilds are cached by their inputs: Docker's layer cache, plus a BuildKit cache
# for the Horovod wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each image: its Dockerfile target, its tag, its requirement files (docker/requirements-NAME.txt, in the order of
# their names: their hash keys the wheel folder) and its wheel folder.
if [ "${1:-}" = tensorflow ]; then
  shift
  TARGET=tensorflow IMAGE="${TENSORFLOW_IMAGE:-horovod-stack:tensorflow}"
  REQUIREMENTS=(build tensorflow tools) WHEELHOUSE="${WHEELHOUSE:-/var/cache/horovod-stack/wheelhouse-tensorflow}"
  # Horovod's NCCL ops for TensorFlow compile with a CUDA 12 folder made of a Debian package and three wheels: the
  # offline path keeps them in the wheel folder (docker/cuda-toolkit-12.sh fetch; their pins key the folder too).
  CUDA12_TOOLKIT=(docker/cuda-toolkit-12.sh docker/requirements-cuda12-toolkit.txt)
else
  TARGET=image IMAGE="${IMAGE:-horovod-stack:latest}"
  REQUIREMENTS=(build cuda-toolkit runtime tools) WHEELHOUSE="${WHEELHOUSE:-/var/cache/horovod-stack/wheelhouse}"
  CUDA12_TOOLKIT=()
fi
BASE_IMAGE="${BASE_IMAGE:-debian:bookworm-slim}"
LOCAL_BASE_IMAGE="${LOCAL_BASE_IMAGE:-horovod-stack-base:bookworm}"
CA_BUNDLE="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
BUILD_PATH="${BUILD_PATH:-auto}"
# A pull that neither succeeds nor fails in this time (a network that drops packets) counts as failed.
BASE_PULL_TIMEOUT="${BASE_PULL_TIMEOUT:-120}"
HOROVOD_SDIST=horovod==0.28.1
# The image's Python and C library: Debian 12's (CPython 3.11, glibc 2.36), whatever the host runs.
IMAGE_PYTHON=3.11
IMAGE_GLIBC_MINOR=36
log() { echo "[build-images] $*"; }
fail() { echo "build-images: $*" >&2; exit 1; }

dry_run=0 wheels_only=0
case "${1:-}" in
  "") ;;
  --dry-run) dry_run=1 ;;
  wheels) wheels_only=1 ;;
  *) echo "usage: $0 [tensorflow] [--dry-run | wheels]" >&2; exit 2 ;;
esac

# The engine to build with: the one that answers, or, only on a host scripts/host-setup.sh serves (Debian 12, root,
# apt), one it sets up. Any other host ends here in one line naming the fix, before anything is installed.
ensure_engine() {
  local problem unserved
  problem=$(scripts/host-setup.sh engine-problem)
  if [ -z "$problem" ]; then
    log "using the Docker engine $(docker version -f '{{.Server.Version}}') as it is (no host set-up)"
    return
  fi
  unserved=$(scripts/host-setup.sh host-problem)
  if [ -n "$unserved" ]; then
    fail "no Docker engine to build with ($problem); $unserved: install Docker Engine with Compose 2.17 or newer \
and buildx (https://docs.docker.com/engine/install/; a user in the docker group may run it), then run this again"
  fi
  if [ "$dry_run" = 1 ]; then
    log "$problem: would set up the engine (scripts/host-setup.sh engine)"
    exit 0
  fi
  log "$problem: setting up the engine (scripts/host-setup.sh engine)"
  scripts/host-setup.sh engine
}

# Sets build_path (online|offline) and why.
choose_path() {
  case "$BUILD_PATH" in
    online|offline) build_path=$BUILD_PATH why="BUILD_PATH=$BUILD_PATH"; return ;;
    auto) ;;
    *) fail "BUILD_PATH=$BUILD_PATH: use online, offline or auto" ;;
  esac
  if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    build_path=online why="the base image $BASE_IMAGE is here"
    return
  fi
  local out status=0
  log "pulling the base image $BASE_IMAGE (at most ${BASE_PULL_TIMEOUT} s)"
  out=$(timeout "$BASE_PULL_TIMEOUT" docker pull -q "$BASE_IMAGE" 2>&1) || status=$?
  if [ "$status" = 0 ]; then
    build_path=online why="the base image $BASE_IMAGE was pulled"
  elif [ "$status" = 124 ]; then
    build_path=offline why="pulling $BASE_IMAGE got no answer in ${BASE_PULL_TIMEOUT} s"
  else
    build_path=offline why="$BASE_IMAGE cannot be pulled ($(tail -1 <<< "$out"))"
  fi
}

# pip's options that select wheels for the image's Python rather than the host's.
wheel_target() {
  local arch glibc
  arch=$(docker info -f '{{.Architecture}}' 2>/dev/null) || arch=$(uname -m)
  echo --only-binary=:all: --implementation cp --python-version "$IMAGE_PYTHON" --abi "cp${IMAGE_PYTHON/./}"
  for glibc in $(seq "$IMAGE_GLIBC_MINOR" -1 5); do echo --platform "manylinux_2_${glibc}_$arch"; done
  case "$arch" in
    x86_64) echo --platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64 ;;
    aarch64) echo --platform manylinux2014_aarch64 ;;
  esac
}

# The wheel folder for the offline path, filled once per set of requirements and target: their key lies beside
# the folder (WHEELHOUSE.complete), not in it, since the folder is a build context and any file changing in it
# would rebuild the image's layers. A later run with the same key touches nothing; a changed key downloads only
# what the folder lacks (pip download keeps the files already there).
fill_wheelhouse() {
  local target wanted marker="${WHEELHOUSE%/}.complete" files=() name
  for name in "${REQUIREMENTS[@]}"; do files+=("docker/requirements-$name.txt"); done
  mapfile -t target < <(wheel_target | tr ' ' '\n')
  wanted=$({ cat "${files[@]}" "${CUDA12_TOOLKIT[@]}"; echo "$HOROVOD_SDIST"; echo "${target[*]}"; } | sha256sum | cut -c1-16)
  if [ "$(cat "$marker" 2>/dev/null)" = "$wanted" ]; then
    log "wheel folder $WHEELHOUSE complete"
    return
  fi
  mkdir -p "$WHEELHOUSE" 2>/dev/null && [ -w "$WHEELHOUSE" ] && [ -w "$(dirname "$marker")" ] ||
    fail "the wheel folder $WHEELHOUSE is not writable here; run as root once, or set WHEELHOUSE to a folder of yours"
  python3 -m pip --version >/dev/null 2>&1 ||
    fail "the offline path fills $WHEELHOUSE with the host's pip: install it (python3-pip; any Python 3 will do)"
  log "filling $WHEELHOUSE for CPython $IMAGE_PYTHON, manylinux (once; several GB of wheels)"
  python3 -m pip download -q -d "$WHEELHOUSE" "${target[@]}" $(printf -- '-r %s ' "${files[@]}")
  python3 -m pip download -q -d "$WHEELHOUSE" --no-deps --no-binary :all: "$HOROVOD_SDIST"
  [ "${#CUDA12_TOOLKIT[@]}" = 0 ] || "${CUDA12_TOOLKIT[0]}" fetch "$WHEELHOUSE"
  echo "$wanted" > "$marker"
}

if [ "$wheels_only" = 1 ]; then
  fill_wheelhouse
  exit 0
fi
ensure_engine
choose_path
if [ "$build_path" = online ]; then
  log "online path: $why; pip installs from its index"
  build_args=(--build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg PIP_OFFLINE=0)
else
  log "offline path: $why; the local base image $LOCAL_BASE_IMAGE and the wheel folder $WHEELHOUSE"
  build_args=(--build-arg "BASE_IMAGE=$LOCAL_BASE_IMAGE" --build-arg PIP_OFFLINE=1 --build-context "wheels=$WHEELHOUSE")
fi
if [ "$dry_run" = 1 ]; then
  log "would build $IMAGE: docker buildx build --target $TARGET ${build_args[*]} ."
  exit 0
fi
if [ "$build_path" = offline ]; then
  scripts/build-base-image.sh "$LOCAL_BASE_IMAGE"
  fill_wheelhouse
fi

secret=()
[ -s "$CA_BUNDLE" ] && secret=(--secret "id=ca,src=$CA_BUNDLE")
log "building $IMAGE"
started=$SECONDS
docker buildx build --progress "${BUILD_PROGRESS:-plain}" --target "$TARGET" "${build_args[@]}" "${secret[@]}" \
  -t "$IMAGE" --load .
log "$IMAGE built in $((SECONDS - started)) s, $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.2f GB", $1/1e9}')"
