#!/usr/bin/env bash
# Makes a Docker engine with Compose v2 available on a fresh Debian 12 CI machine and starts it.
# Bookworm's own docker.io is too old (no Compose v2); trixie's engine installs cleanly beside
# bookworm's libc when pinned low so nothing else comes from trixie.
set -euo pipefail

if ! command -v dockerd >/dev/null || ! docker compose version >/dev/null 2>&1; then
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  cat > /etc/apt/sources.list.d/trixie.sources <<SRC
Types: deb
URIs: $mirror
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  printf 'Package: *\nPin: release n=trixie\nPin-Priority: 100\n' > /etc/apt/preferences.d/trixie-low
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q -t trixie docker.io docker-compose docker-buildx
fi

if ! docker info >/dev/null 2>&1; then
  mkdir -p /var/log/horovod-stack
  setsid dockerd > /var/log/horovod-stack/dockerd.log 2>&1 < /dev/null &
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /var/log/horovod-stack/dockerd.log" >&2; exit 1; }
fi
echo "docker engine $(docker version -f '{{.Server.Version}}'), $(docker compose version --short 2>/dev/null | sed 's/^/compose /')"
