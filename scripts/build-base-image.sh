#!/usr/bin/env bash
# Makes the local base image the Dockerfile builds on where no registry can be reached (the offline path of
# scripts/build-images.sh, which calls this only where the public debian:bookworm-slim cannot be pulled):
#   scripts/build-base-image.sh [TAG]      (default tag: horovod-stack-base:bookworm)
# Debian 12's minimal root file system from the machine's own apt mirror (debootstrap), imported as an
# image. Needs root and a Debian host (debootstrap is installed if missing).
set -euo pipefail
tag="${1:-horovod-stack-base:bookworm}"
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "[base-image] $tag already present"
  exit 0
fi
[ "$(id -u)" = 0 ] ||
  { echo "build-base-image: making $tag needs root (debootstrap); or build online, where debian:bookworm-slim can be pulled" >&2; exit 1; }
command -v debootstrap >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap; }
mirror=$("$(cd "$(dirname "$0")" && pwd)/host-setup.sh" mirror)
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
echo "[base-image] debootstrap bookworm from $mirror (about a minute)"
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" > "$rootfs.log" 2>&1 ||
  { tail -20 "$rootfs.log" >&2; echo "[base-image] debootstrap failed; full log: $rootfs.log" >&2; exit 1; }
rm -f "$rootfs.log"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'CMD ["/bin/bash"]' - "$tag" >/dev/null
echo "[base-image] imported $tag"
