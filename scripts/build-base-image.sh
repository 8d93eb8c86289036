#!/usr/bin/env bash
# Makes the local base image the Dockerfile builds on where no registry can be reached (the offline path of
# scripts/build-images.sh, which calls this only where the public debian:bookworm-slim cannot be pulled):
#   scripts/build-base-image.sh [TAG [SUITE [PACKAGE...]]]   (default: horovod-stack-base:bookworm bookworm)
# A Debian release's minimal root file system (SUITE, default bookworm: Debian 12) from the machine's own apt
# mirror (debootstrap), with PACKAGE... added by debootstrap, imported as an image. Needs root and a Debian host
# (debootstrap is installed if missing). tests/test_launcher_install.py makes its Debian 13 image with Python 3.13
# here: scripts/build-base-image.sh TAG trixie python3 python3-venv
set -euo pipefail
tag="${1:-horovod-stack-base:bookworm}"
suite="${2:-bookworm}"
packages=("${@:3}")
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "[base-image] $tag already present"
  exit 0
fi
[ "$(id -u)" = 0 ] ||
  { echo "build-base-image: making $tag needs root (debootstrap); or build online, where debian:bookworm-slim can be pulled" >&2
    exit 1; }
command -v debootstrap >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap; }
mirror=$("$(cd "$(dirname "$0")" && pwd)/host-setup.sh" mirror)
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
# mktemp's folder is root's alone (0700), and becomes the root file system's /: a package whose set-up runs as a
# user of its own (munge's, through su) could not reach /bin/sh.
chmod 0755 "$rootfs"
include=()
if [ "${#packages[@]}" -gt 0 ]; then
  include=("--include=$(IFS=,; echo "${packages[*]}")")
fi
echo "[base-image] debootstrap $suite ${packages[*]} from $mirror (about a minute)"
debootstrap --variant=minbase "${include[@]}" "$suite" "$rootfs" "$mirror" > "$rootfs.log" 2>&1 ||
  { tail -20 "$rootfs.log" >&2; echo "[base-image] debootstrap failed; full log: $rootfs.log" >&2; exit 1; }
rm -f "$rootfs.log"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'CMD ["/bin/bash"]' - "$tag" >/dev/null
echo "[base-image] imported $tag"
