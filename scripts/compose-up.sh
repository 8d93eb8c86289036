#!/usr/bin/env bash
# The quick-start job as a containerized cluster on this host:
#   scripts/compose-up.sh [cpu|gpu]        (default cpu)
# Needs only Docker Engine with Compose 2.17 or newer and buildx (any distribution; a user in the docker group
# will do): it builds the image (scripts/build-images.sh; minutes the first time, seconds after), installing
# nothing on the host. Only where no engine answers does build-images.sh set one up, and only on Debian 12 as root
# (scripts/host-setup.sh engine); any other host ends there in one line: install Docker Engine. Then it runs
#   docker compose up                                        (gpu: -f compose.yaml -f compose.gpu.yaml)
# which starts the workers and the launcher, trains, and returns when training ends, every container stopped;
# then `docker compose down` (the stopped containers go; the shared volume with metrics and checkpoints stays),
# and it exits with the job's status (plain `up` itself exits 0 whatever the job did).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-cpu}" in
  cpu) files=() ;;
  gpu) files=(-f compose.yaml -f compose.gpu.yaml) ;;
  *) echo "usage: $0 [cpu|gpu]" >&2; exit 2 ;;
esac
scripts/build-images.sh
docker compose "${files[@]}" up
launcher=$(docker compose "${files[@]}" ps --all --quiet launcher)
status=$(docker inspect -f '{{.State.ExitCode}}' "$launcher" 2>/dev/null || echo 1)
docker compose "${files[@]}" down >/dev/null 2>&1 || true
echo "job exit status: $status"
exit "$status"
