#!/usr/bin/env bash
# Everything this host needs for the README's two commands (scripts/compose-up.sh and scripts/test.sh), from one
# idempotent place; both call it, so either can run first. A second run finds everything and takes a second.
#
#   scripts/host-setup.sh [packages|engine|all]      (default all)
#   scripts/host-setup.sh check-plan PACKAGE...      (only the guard below, on apt's simulated plan)
#
# packages: Open MPI, OpenSSH, a C++ compiler, debootstrap, iproute2/iptables/nsenter and a Python 3.11 venv,
#           from the host's own apt sources only. Before installing, apt's plan is simulated: a plan that
#           would remove a package, or move an installed one to another upstream version (another Debian
#           release), stops here with the list, before anything changes. Debian's own revisions of an
#           installed version (a bookworm security fix, such as the openssh-client that openssh-server
#           must match) are allowed and logged. HOROVOD_STACK_ALLOW_HOST_CHANGES=1 lets the whole plan through.
# engine:   a running Docker engine with Compose v2 and buildx. An engine already on the host (Docker CE,
#           Debian's docker.io) is used as it is, and SKIP_DOCKER_INSTALL=1 makes a missing one an error
#           instead of an install. Otherwise Debian 13's engine (the only Compose v2 engine in Debian's
#           archive) is unpacked into $ENGINE_ROOT, outside dpkg, and run from there: the host's packages
#           stay its own release (only bookworm's runc and iptables are added through apt). Its CLI plugins
#           are linked into /usr/local/lib/docker/cli-plugins, its docker CLI into /usr/local/bin if the host
#           has none, and dockerd logs to /var/log/horovod-stack/dockerd.log.
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE_ROOT="${ENGINE_ROOT:-/opt/horovod-stack/engine}"
ENGINE_DEBS=(docker.io docker-cli docker-compose docker-buildx containerd tini)
CLI_PLUGINS=/usr/local/lib/docker/cli-plugins
LOG_DIR=/var/log/horovod-stack
log() { echo "[host-setup] $*"; }
fail() { echo "host-setup: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "run as root (it installs system packages and starts dockerd)"

apt_updated=0
apt_update_once() {
  [ "$apt_updated" = 1 ] && return
  apt-get update -q >/dev/null
  apt_updated=1
}

# Lines "pkg: OLD -> NEW" for each installed package apt's plan would move to another upstream version, and
# "pkg: removed" for each removal. Debian revisions of the same upstream version (1:9.2p1-2+deb12u6 ->
# 1:9.2p1-2+deb12u10) are not listed.
host_changes() {
  apt-get -s install -y "$@" | awk '
    function upstream(v) { sub(/-[^-]*$/, "", v); return v }
    /^Remv / { print $2 ": removed" }
    /^Inst [^ ]+ \[/ {
      old = $3; gsub(/[][]/, "", old); new = $4; sub(/^\(/, "", new)
      if (upstream(old) != upstream(new)) print $2 ": " old " -> " new
    }'
}

# Debian revisions of installed packages that the plan brings (logged, allowed).
host_revisions() {
  apt-get -s install -y "$@" | awk '/^Inst [^ ]+ \[/ { old = $3; gsub(/[][]/, "", old); new = $4; sub(/^\(/, "", new); print $2 " " old " -> " new }'
}

# Stops, before anything changes, if installing these packages would remove or re-version the host's own.
refuse_host_changes() {
  local changes
  changes=$(host_changes "$@")
  if [ -n "$changes" ] && [ "${HOROVOD_STACK_ALLOW_HOST_CHANGES:-0}" != 1 ]; then
    echo "host-setup: installing $* would change this host's own packages:" >&2
    sed 's/^/  /' <<< "$changes" >&2
    fail "nothing was changed; install those packages yourself, or rerun with HOROVOD_STACK_ALLOW_HOST_CHANGES=1 to allow it"
  fi
}

apt_install() {
  apt_update_once
  refuse_host_changes "$@"
  local revisions
  revisions=$(host_revisions "$@")
  [ -n "$revisions" ] && log "Debian revisions of installed packages that come with them: $(paste -sd, <<< "$revisions")"
  log "installing: $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >/dev/null
}

has_python311_venv() {
  local candidate
  for candidate in python3 python3.11; do
    "$candidate" -c 'import sys, ensurepip; assert sys.version_info[:2] == (3, 11)' 2>/dev/null && return 0
  done
  return 1
}

ensure_packages() {
  local missing=() pair
  # command:package; a command already on PATH (from any source) is used as it is.
  for pair in mpirun:openmpi-bin mpicc:libopenmpi-dev ssh:openssh-client sshd:openssh-server g++:g++ make:make \
              ip:iproute2 iptables:iptables nsenter:util-linux debootstrap:debootstrap; do
    command -v "${pair%%:*}" >/dev/null || [ -x "/usr/sbin/${pair%%:*}" ] || missing+=("${pair#*:}")
  done
  has_python311_venv || missing+=(python3.11-venv)
  if [ ${#missing[@]} -gt 0 ]; then
    apt_install "${missing[@]}"
  fi
}

engine_mirror() {
  local mirror
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 !~ /^\[/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  echo "${mirror:-http://deb.debian.org/debian}"
}

# Debian 13's engine packages, fetched with a private apt configuration (the host's sources, lists, caches and
# pins are untouched) and unpacked with dpkg-deb -x (dpkg's database never hears of them).
unpack_private_engine() {
  local work="$ENGINE_ROOT.partial"
  rm -rf "$work"
  mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/apt/sources.d" "$work/debs" "$work/root"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $(engine_mirror) trixie main" > "$work/apt/sources.list"
  local opts=(-o APT::Sandbox::User=root -o "Dir::Etc::sourcelist=$work/apt/sources.list" -o "Dir::Etc::sourceparts=$work/apt/sources.d"
              -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache"
              -o Dir::Etc::preferences=/dev/null -o "Dir::Etc::preferencesparts=$work/apt/sources.d")
  log "fetching Debian 13's Docker engine (${ENGINE_DEBS[*]}) into $ENGINE_ROOT, outside dpkg"
  apt-get "${opts[@]}" update -q >/dev/null
  (cd "$work/debs" && apt-get "${opts[@]}" download "${ENGINE_DEBS[@]}" >/dev/null)
  local deb
  for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
  rm -rf "$work/apt"
  rm -rf "$ENGINE_ROOT"
  mv "$work" "$ENGINE_ROOT"
}

# The docker CLI, compose and buildx: the host's own where they work, else the private engine's.
ensure_cli() {
  local plugin
  if ! command -v docker >/dev/null; then
    ln -sf "$ENGINE_ROOT/root/usr/bin/docker" /usr/local/bin/docker
  fi
  for plugin in compose buildx; do
    if ! docker "$plugin" version >/dev/null 2>&1; then
      [ -x "$ENGINE_ROOT/root/usr/libexec/docker/cli-plugins/docker-$plugin" ] || unpack_private_engine
      mkdir -p "$CLI_PLUGINS"
      ln -sf "$ENGINE_ROOT/root/usr/libexec/docker/cli-plugins/docker-$plugin" "$CLI_PLUGINS/docker-$plugin"
      log "linked docker $plugin into $CLI_PLUGINS"
    fi
  done
}

ensure_engine() {
  if docker info >/dev/null 2>&1; then
    ensure_cli
    log "using the running Docker engine $(docker version -f '{{.Server.Version}}')"
    return
  fi
  local engine_path="$PATH"
  if ! command -v dockerd >/dev/null; then
    [ "${SKIP_DOCKER_INSTALL:-0}" = 1 ] &&
      fail "no Docker engine here and SKIP_DOCKER_INSTALL=1; install Docker (with Compose v2 and buildx) and start it"
    [ -x "$ENGINE_ROOT/root/usr/sbin/dockerd" ] || unpack_private_engine
    # Debian 13's runc needs a newer libc than bookworm's; the rest of its engine runs on bookworm's.
    local pair missing=()
    for pair in runc:runc iptables:iptables; do
      command -v "${pair%%:*}" >/dev/null || [ -x "/usr/sbin/${pair%%:*}" ] || missing+=("${pair#*:}")
    done
    [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
    engine_path="$ENGINE_ROOT/root/usr/sbin:$ENGINE_ROOT/root/usr/bin:$PATH"
  fi
  ensure_cli
  mkdir -p "$LOG_DIR"
  log "starting dockerd (log: $LOG_DIR/dockerd.log)"
  PATH="$engine_path" setsid dockerd > "$LOG_DIR/dockerd.log" 2>&1 < /dev/null &
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || fail "dockerd did not start; see $LOG_DIR/dockerd.log"
  log "Docker engine $(docker version -f '{{.Server.Version}}'), compose $(docker compose version --short)"
}

case "${1:-all}" in
  packages) ensure_packages ;;
  engine) ensure_engine ;;
  all) ensure_packages; ensure_engine ;;
  check-plan) shift; refuse_host_changes "$@"; log "no host package would be removed or re-versioned" ;;
  *) echo "usage: $0 [packages|engine|all|check-plan PACKAGE...]" >&2; exit 2 ;;
esac
