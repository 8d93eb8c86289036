#!/usr/bin/env bash
# Makes the Apptainer image (SIF) of one of the stack's images, for Slurm clusters, from the image on this machine:
#   scripts/build-sif.sh              -> the SIF of horovod-stack:latest, PyTorch (IMAGE overrides the tag)
#   scripts/build-sif.sh tensorflow   -> the SIF of horovod-stack:tensorflow (TENSORFLOW_IMAGE overrides the tag)
#   scripts/build-sif.sh node-image   -> only makes NODE_IMAGE (below) if it is not here, and prints its tag
#   scripts/build-sif.sh prune        -> removes the SIFs of images no tag here names any more (scripts/test.sh, after
#                                        the images are built: a SIF is several GB, and a stale one is of no use)
# The last line printed is the SIF's path: SIF_CACHE/NAME/IMAGE_ID.rRECIPE.sif (NAME: horovod-stack,
# horovod-stack-tensorflow, or the tag's name), made only when the image (or RECIPE) changed since the last one; the
# SIF of an older image of the same name is removed before the new one is built (one SIF per image: each is several
# GB), and an interrupted build leaves nothing behind (it builds in a hidden folder beside it, removed on every way
# out, and renames the SIF).
# Apptainer and mksquashfs run in a container of NODE_IMAGE (a Debian sid root: Apptainer needs glibc 2.38 or newer,
# which the host's Debian 12 lacks), as an unprivileged user: Apptainer run as root needs CAP_SYS_RESOURCE, which
# this machine's root lacks. SIF_COMPRESSION picks mksquashfs's compressor (default lz4: see below).
set -euo pipefail
cd "$(dirname "$0")/.."
NODE_IMAGE="${NODE_IMAGE:-horovod-stack-test-slurm:2}"
# The node root: Apptainer (squashfuse mounts a SIF without root), Slurm's daemons and client, munge, and the test
# cluster's accounting database (slurmdbd, MariaDB's server and client alone: 70 MB, where mariadb-server's set-up
# brings 400). Bump the tag when this list changes. tests/slurmcluster.py runs its Slurm nodes from the same image.
NODE_PACKAGES=(apptainer squashfs-tools squashfuse fuse3 uidmap slurmd slurmctld slurm-client munge slurmdbd mariadb-server-core mariadb-client-core)
SIF_CACHE="${SIF_CACHE:-/var/cache/horovod-stack/sif}"
# The way a SIF is made here: part of its file name, so a change to it (bump it) remakes the SIFs made before.
RECIPE=2
# lz4 builds in about a third of the time of mksquashfs's default (gzip) on 2 CPUs for a SIF about a third larger,
# and reads faster; a SIF built here is read on this machine and in CI, where build time is what is short.
SIF_COMPRESSION="${SIF_COMPRESSION:-lz4}"
log() { echo "[build-sif] $*" >&2; }
fail() { echo "build-sif: $*" >&2; exit 1; }

ensure_node_image() {
  docker image inspect "$NODE_IMAGE" >/dev/null 2>&1 && return
  log "making the node image $NODE_IMAGE (debootstrap of Debian sid, about a minute)"
  scripts/build-base-image.sh "$NODE_IMAGE" sid "${NODE_PACKAGES[@]}" >&2
}

case "${1:-}" in
  "") IMAGE="${IMAGE:-horovod-stack:latest}" ;;
  tensorflow) IMAGE="${TENSORFLOW_IMAGE:-horovod-stack:tensorflow}" ;;
  node-image) ensure_node_image; echo "$NODE_IMAGE"; exit 0 ;;
  prune)
    current=$(docker images --no-trunc --filter dangling=false --format '{{.ID}}' | sed 's/^sha256://')
    find "$SIF_CACHE" -mindepth 2 -maxdepth 2 -name '*.sif' 2>/dev/null | while IFS= read -r stale; do
      id=${stale##*/}
      if ! grep -qx "${id%%.*}" <<<"$current"; then
        log "removing $stale (its image is gone: $(du -h "$stale" | cut -f1) freed)"
        rm -f "$stale"
      fi
    done
    exit 0 ;;
  *) echo "usage: $0 [tensorflow | node-image | prune]" >&2; exit 2 ;;
esac
case "$SIF_COMPRESSION" in
  gzip|lz4|zstd|xz|lzo) ;;
  *) fail "SIF_COMPRESSION=$SIF_COMPRESSION: use gzip, lz4, zstd, xz or lzo" ;;
esac

image_id=$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null) ||
  fail "no image $IMAGE here: build it first (scripts/build-images.sh${1:+ $1})"
image_id=${image_id#sha256:}
name=${IMAGE%:latest}
name=${name//[:\/]/-}
folder="$SIF_CACHE/$name"
sif="$folder/$image_id.r$RECIPE.sif"
if [ -s "$sif" ]; then
  log "$IMAGE: $sif is current"
  echo "$sif"
  exit 0
fi
ensure_node_image
mkdir -p "$folder"
# A SIF of an older image of this name is of no more use, and the build needs the disk space: the image's files
# unpacked and their squashed copy at once, up to about 1.6 times the image's size.
find "$folder" -maxdepth 1 -name '*.sif' -delete
needed=$(( $(docker image inspect -f '{{.Size}}' "$IMAGE") * 16 / 10 >> 20 ))
free=$(df -Pm "$folder" | awk 'NR == 2 {print $4}')
[ "$free" -ge "$needed" ] || fail "building the SIF of $IMAGE needs about $needed MiB free in $folder, which has \
$free MiB: free some (docker image prune, docker builder prune) or set SIF_CACHE to a folder on a larger disk"
container="horovod-stack-sif-$$"
work=".build.$$"
exported=""
cleanup() {
  docker rm -f "$container" >/dev/null 2>&1 || true
  [ -z "$exported" ] || docker rm -f "$exported" >/dev/null 2>&1 || true
  rm -rf "${folder:?}/$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
log "building the SIF of $IMAGE ($SIF_COMPRESSION) in $folder"
started=$SECONDS
mkdir -m 0700 "$folder/$work"
# The image's environment and command, as Apptainer's docker:// conversion keeps them: each value in single quotes,
# which sh and Apptainer's reader of its environment scripts both take as it is.
quoted() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
while IFS= read -r line; do
  if [ -n "$line" ]; then echo "export ${line%%=*}=$(quoted "${line#*=}")"; fi
done < <(docker image inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE") > "$folder/$work/env.sh"
{
  echo '#!/bin/sh'
  printf exec
  while IFS= read -r word; do
    if [ -n "$word" ]; then printf ' %s' "$(quoted "$word")"; fi
  done < <(docker image inspect -f '{{range .Config.Entrypoint}}{{println .}}{{end}}' "$IMAGE"
           docker image inspect -f '{{range .Config.Cmd}}{{println .}}{{end}}' "$IMAGE")
  echo ' "$@"'
} > "$folder/$work/runscript"
exported=$(docker create --label horovod-stack.sif=export "$IMAGE" true)
# The image's files stream from the engine into the builder (`docker export`): no archive on the disk, and the
# image's layers are unpacked once, where Apptainer's own docker-daemon:// conversion keeps an archive of the image,
# an OCI copy of it and its unpacked root at once (three times its size, 20 GB for the PyTorch image).
docker export "$exported" | docker run -i --rm --privileged --name "$container" -v "$folder/$work:/work" \
  -e COMPRESSION="$SIF_COMPRESSION" "$NODE_IMAGE" bash -euc '
    useradd -m -u 1000 builder
    chown builder /work
    chmod 666 /dev/fuse
    exec su builder -s /bin/bash -c "$(cat <<"BUILD"
      set -euo pipefail
      cd /work
      mkdir rootfs empty
      tar -x -p -C rootfs --exclude="dev/*" --exclude=.dockerenv
      # Apptainer'"'"'s own files of a container (environment scripts, actions), from an empty one of its making.
      APPTAINER_TMPDIR=/work apptainer -q build --sandbox skeleton empty/
      cp -a skeleton/.singularity.d rootfs/
      rm -rf skeleton empty
      mv env.sh rootfs/.singularity.d/env/10-docker2singularity.sh
      install -m 0755 runscript rootfs/.singularity.d/runscript
      mksquashfs rootfs rootfs.squashfs -noappend -all-root -comp "$COMPRESSION" -quiet -no-progress
      rm -rf rootfs
      apptainer sif new image.sif
      # One partition: the root file system (2: the primary system partition, 1: SquashFS, 2: amd64).
      apptainer sif add --datatype 4 --parttype 2 --partfs 1 --partarch 2 --groupid 1 image.sif rootfs.squashfs
      rm rootfs.squashfs
BUILD
    )"' >&2 &
# In the background and waited for, so that an interrupt reaches the traps at once (bash runs a trap only once the
# foreground command has ended): cleanup removes the builder, and the export ends with its pipe.
wait $!
mv "$folder/$work/image.sif" "$sif"
chown 0:0 "$sif"
chmod 0644 "$sif"
log "$sif built in $((SECONDS - started)) s, $(du -h "$sif" | cut -f1)"
echo "$sif"
