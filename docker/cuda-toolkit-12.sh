#!/usr/bin/env bash
# A CUDA 12 compiler folder for building Horovod's NCCL ops against TensorFlow 2.21 (whose wheels are CUDA 12 builds),
# made from what a Debian 12 machine reaches without NVIDIA's apt repository or a CUDA base image:
#
#   cuda-toolkit-12.sh fetch WHEELHOUSE
#       downloads the four pieces into WHEELHOUSE/cuda-12.4/, each checked by its sha256 (scripts/build-images.sh:
#       the offline build's wheel folder keeps them beside TensorFlow's wheels)
#   cuda-toolkit-12.sh make CUDA_HOME SITE_PACKAGES
#       assembles CUDA_HOME from the pieces in $CUDA_TOOLKIT_SOURCES (default /wheels/cuda-12.4: the offline build's
#       wheel folder, mounted at /wheels) or, where that folder lacks them, fetched (docker/install-horovod.sh, in
#       the image's build stage only)
#
# The pieces, and why each:
# - Debian's own `nvidia-cuda-toolkit` 12.4.131 (trixie, component non-free; 87 MB): nvcc, cicc, ptxas, nvlink,
#   fatbinary, cudafe++ and libdevice. Unpacked with dpkg-deb, never installed; its binaries need glibc 2.7 only, so
#   they run on Debian 12, and they accept its gcc 12. PyPI has no whole CUDA 12 nvcc (its -cu12 nvcc wheels carry
#   ptxas alone), and bookworm's own toolkit is 11.8.
# - PyPI's nvidia-cuda-runtime-cu12 12.4.127, nvidia-cuda-nvcc-cu12 12.4.131 and nvidia-cuda-cccl-cu12 12.4.127.post1
#   (26 MB): the headers of that same release (the .deb has none). They are unpacked into CUDA_HOME only, never
#   installed: TensorFlow's environment pins its CUDA wheels to 12.5.82 or newer.
# - lib64 from TensorFlow's own cudart wheel (12.9, in SITE_PACKAGES): libcudart.so, so that Horovod links the very
#   cudart TensorFlow loads, and libcudart_static.a for the test program CMake's CUDA compiler check links; beside
#   them an empty libcudadevrt.a (below says why). Debian's nvidia-cuda-dev has both static libraries of 12.4, but
#   weighs 934 MB for two files only the compiler check links. Code nvcc 12.4 compiles runs on any CUDA 12 runtime.
# Nothing here enters a final image: the Dockerfile's build stage makes CUDA_HOME and hands on only Horovod's wheel.
# The NVIDIA driver's own library (libcuda1, which the full toolkit package set depends on) is never fetched.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# One home for the pinned pieces: the .deb here, the wheels in requirements-cuda12-toolkit.txt (with their sha256).
DEB=nvidia-cuda-toolkit_12.4.131~12.4.1-2_amd64.deb
DEB_VERSION=12.4.131~12.4.1-2
DEB_SHA256=cd5fe85aee38d108b315f408a688641478f2402622a10c677478eb7a6c4e5319
DEB_SUITE=trixie
WHEELS="$here/requirements-cuda12-toolkit.txt"
RELEASE=12.4.131
PIECES=cuda-12.4  # the pieces' folder in a wheel folder

log() { echo "[cuda-toolkit-12] $*" >&2; }
fail() { echo "cuda-toolkit-12: $*" >&2; exit 1; }

# The Debian mirror this machine's apt uses (deb822 or one-line sources; the first URI).
debian_mirror() {
  local uri
  uri=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' \
    /etc/apt/sources.list 2>/dev/null || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

sha256_ok() { [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

# fetch_deb DIR: the .deb into DIR, through apt with a private state and sources list (the machine's own apt
# configuration and package database untouched), then checked.
fetch_deb() {
  local dir=$1 apt_dir
  if [ -f "$dir/$DEB" ] && sha256_ok "$dir/$DEB" "$DEB_SHA256"; then return; fi
  command -v apt-get >/dev/null || fail "no apt-get here to download $DEB; put it into $dir by hand"
  apt_dir=$(mktemp -d)
  mkdir -p "$apt_dir/state/lists/partial" "$apt_dir/cache/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $(debian_mirror) $DEB_SUITE non-free" \
    > "$apt_dir/sources.list"
  local apt_options=(-q -o "Dir::State=$apt_dir/state" -o "Dir::Cache=$apt_dir/cache"
    -o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null -o APT::Sandbox::User=root)
  log "downloading $DEB from Debian $DEB_SUITE non-free ($(debian_mirror))"
  apt-get "${apt_options[@]}" update >/dev/null ||
    fail "apt-get update of Debian $DEB_SUITE non-free failed at $(debian_mirror)"
  (cd "$dir" && apt-get "${apt_options[@]}" download "nvidia-cuda-toolkit=$DEB_VERSION" >/dev/null) ||
    fail "Debian $DEB_SUITE non-free no longer serves nvidia-cuda-toolkit $DEB_VERSION; update DEB* in $0"
  rm -rf "$apt_dir"
  sha256_ok "$dir/$DEB" "$DEB_SHA256" || { rm -f "$dir/$DEB"; fail "$DEB does not match its sha256 ($DEB_SHA256)"; }
}

# fetch_wheels DIR PYTHON: the three wheels into DIR (pip checks their sha256: --require-hashes).
fetch_wheels() {
  local dir=$1 python=$2
  "$python" -m pip download -q --no-deps --require-hashes --only-binary :all: --platform manylinux2014_x86_64 \
    -d "$dir" -r "$WHEELS" ||
    fail "pip could not fetch the CUDA 12.4 header wheels ($WHEELS)"
}

fetch() {
  local dir=${1:?usage: cuda-toolkit-12.sh fetch WHEELHOUSE}/$PIECES
  mkdir -p "$dir"
  fetch_deb "$dir"
  fetch_wheels "$dir" "${PYTHON:-python3}"
  log "$dir: $DEB and the three wheels, checked"
}

make_home() {
  local cuda_home=${1:?usage: cuda-toolkit-12.sh make CUDA_HOME SITE_PACKAGES} site=${2:?usage: cuda-toolkit-12.sh make CUDA_HOME SITE_PACKAGES}
  local sources="${CUDA_TOOLKIT_SOURCES:-/wheels/$PIECES}" work wheel
  local cudart="$site/nvidia/cuda_runtime/lib"
  [ -f "$cudart/libcudart.so.12" ] && [ -f "$cudart/libcudart_static.a" ] ||
    fail "no CUDA 12 runtime in $site/nvidia/cuda_runtime (TensorFlow's [and-cuda] wheels); install tensorflow[and-cuda] first"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  local deb="$sources/$DEB"
  if [ -f "$deb" ]; then
    log "pieces from $sources"
    sha256_ok "$deb" "$DEB_SHA256" || fail "$deb does not match its sha256 ($DEB_SHA256)"
    local -x PIP_NO_INDEX=1 PIP_FIND_LINKS="$sources"  # the wheels from there too, for fetch_wheels' pip
  else
    fetch_deb "$work"
    deb="$work/$DEB"
  fi
  fetch_wheels "$work" "${PYTHON:-python3}"

  rm -rf "$cuda_home"
  mkdir -p "$cuda_home/bin" "$cuda_home/include" "$cuda_home/lib64" "$cuda_home/nvvm"
  dpkg-deb -x "$deb" "$work/deb"
  local tools="$work/deb/usr/lib/nvidia-cuda-toolkit"
  cp -a "$tools/bin/nvcc" "$tools/bin/cicc" "$tools/bin/crt" "$cuda_home/bin/"
  cp -a "$work/deb/usr/bin/"{ptxas,nvlink,fatbinary,cudafe++,bin2c,nvprune,cuobjdump} "$cuda_home/bin/"
  cp -a "$tools/libdevice" "$cuda_home/nvvm/"
  # Debian's nvcc.profile names Debian's install paths; this one is CUDA's own, relative to nvcc.
  cat > "$cuda_home/bin/nvcc.profile" <<'EOF'
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
PATH            += $(TOP)/bin:
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64"
EOF
  for wheel in "$work"/nvidia_cuda_*.whl; do
    python3 -m zipfile -e "$wheel" "$work/wheels"
  done
  local package
  for package in cuda_runtime cuda_nvcc cuda_cccl; do
    cp -a "$work/wheels/nvidia/$package/include/." "$cuda_home/include/"
  done
  ln -s "$cudart/libcudart.so.12" "$cuda_home/lib64/libcudart.so"
  ln -s "$cudart/libcudart.so.12" "$cuda_home/lib64/libcudart.so.12"
  ln -s "$cudart/libcudart_static.a" "$cuda_home/lib64/libcudart_static.a"
  # An empty device runtime: nvcc links libcudadevrt.a into every executable (CMake's check builds one), TensorFlow's
  # 12.9 copy is refused by nvlink 12.4 ("newer than toolkit"), and Horovod compiles no relocatable device code
  # (no -rdc), so nothing of it is ever used.
  ar rc "$cuda_home/lib64/libcudadevrt.a"
  local version
  version=$("$cuda_home/bin/nvcc" --version | sed -n 's/.*, V\([0-9.]*\)$/\1/p')
  [ "$version" = "$RELEASE" ] || fail "the assembled nvcc reports '${version:-nothing}', not $RELEASE"
  log "$cuda_home: nvcc $version, CUDA 12.4 headers, TensorFlow's cudart ($(readlink -f "$cudart/libcudart.so.12"))"
}

case "${1:-}" in
  fetch) shift; fetch "$@" ;;
  make) shift; make_home "$@" ;;
  *) echo "usage: $0 fetch WHEELHOUSE | make CUDA_HOME SITE_PACKAGES" >&2; exit 2 ;;
esac
