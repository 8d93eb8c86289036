#!/usr/bin/env bash
# Builds the stack's image on this machine, registry or not:
#   scripts/build-images.sh                 -> horovod-stack:latest (IMAGE overrides the tag)
# 1. prepares the host and starts the Docker engine if needed (scripts/host-setup.sh);
# 2. makes the local Debian base image unless BASE_IMAGE names another one;
# 3. fills a wheel folder (torch, torchvision, CUDA toolkit wheels, the Horovod sdist, ...) once, from pip's
#    configured sources, so the image build itself needs no index;
# 4. builds the Dockerfile with that folder as the `wheels` context and this machine's CA bundle as a
#    build secret (mounted for pip only, never stored in a layer).
# Rebuilds are cached by their inputs: Docker's layer cache, plus a BuildKit cache for the Horovod wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE="${IMAGE:-horovod-stack:latest}"
BASE_IMAGE="${BASE_IMAGE:-horovod-stack-base:bookworm}"
WHEELHOUSE="${WHEELHOUSE:-/var/cache/horovod-stack/wheelhouse}"
CA_BUNDLE="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

scripts/host-setup.sh
if [ "$BASE_IMAGE" = horovod-stack-base:bookworm ]; then
  scripts/build-base-image.sh "$BASE_IMAGE"
fi

requirements=(-r docker/requirements-runtime.txt -r docker/requirements-build.txt -r docker/requirements-cuda-toolkit.txt
  -r docker/requirements-tools.txt)
wanted=$({ cat docker/requirements-*.txt; echo horovod==0.28.1; } | sha256sum | cut -c1-16)
if [ "$(cat "$WHEELHOUSE/.complete" 2>/dev/null)" != "$wanted" ]; then
  echo "[build-images] filling $WHEELHOUSE (once; several GB of wheels)"
  mkdir -p "$WHEELHOUSE"
  python3 -m pip download -q -d "$WHEELHOUSE" "${requirements[@]}"
  python3 -m pip download -q -d "$WHEELHOUSE" --no-deps --no-binary :all: horovod==0.28.1
  echo "$wanted" > "$WHEELHOUSE/.complete"
fi

secret=()
[ -s "$CA_BUNDLE" ] && secret=(--secret "id=ca,src=$CA_BUNDLE")
echo "[build-images] building $IMAGE on $BASE_IMAGE"
started=$SECONDS
docker buildx build --progress "${BUILD_PROGRESS:-plain}" --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg PIP_OFFLINE=1 \
  --build-context "wheels=$WHEELHOUSE" "${secret[@]}" -t "$IMAGE" --load .
echo "[build-images] $IMAGE built in $((SECONDS - started)) s, $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.2f GB", $1/1e9}')"
