#!/usr/bin/env bash
# The quick-start job as a containerized cluster on this host:
#   scripts/compose-up.sh [cpu|gpu]        (default cpu)
# Needs only Docker Engine with Compose 2.17 or newer and buildx (any distribution; a user in the docker group
# will do): it builds the image (scripts/build-images.sh; minutes the first time, seconds after), installing
# nothing on the host. Only where no engine answers does build-images.sh set one up, and only on Debian 12 as root
# (scripts/host-setup.sh engine); any other host ends there in one line: install Docker Engine. Then it runs
#   docker compose up                                        (gpu: -f compose.yaml -f compose.gpu.yaml)
# which starts the workers and the launcher, trains, and returns when training ends, every container stopped;
# then it copies the run's folder out of the shared volume into RESULTS_DIR on this host (.env; compose.yaml's
# default ./runs: ./runs/<run id>/ with metrics.jsonl and curves.png, owned by whoever ran this), runs
# `docker compose down` (the stopped containers go; the shared volume with metrics and checkpoints stays), and
# exits with the job's status (plain `up` itself exits 0 whatever the job did).
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
# The copy the job agent's last line names (launcher/agent/compose.py results_hint): its run folder, into
# RESULTS_DIR as the launcher container had it.
run=$(docker logs "$launcher" 2>&1 | sed -n 's|.*docker compose cp launcher:\(/shared/runs/[A-Za-z0-9._-]*\) .*|\1|p' | tail -n 1)
results=$(docker inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$launcher" 2>/dev/null | sed -n 's/^RESULTS_DIR=//p')
if [ -n "$run" ] && [ -n "$results" ]; then
  results=${results%/}
  if mkdir -p "$results" && copied=$(docker compose "${files[@]}" cp "launcher:$run" "$results/" 2>&1); then
    folder="$results/${run##*/}"
    if [ "$(id -u)" = 0 ] && [ -n "${SUDO_UID:-}" ]; then  # under sudo: the files are the user's, not root's
      chown -R "$SUDO_UID:${SUDO_GID:-$SUDO_UID}" "$folder"
    fi
    echo "results: $folder ($(find "$folder" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort | paste -sd, - | sed 's/,/, /g'))"
  else
    echo "results: not copied from the volume (${copied##*$'\n'}); they stay there, at $run" >&2
  fi
fi
docker compose "${files[@]}" down >/dev/null 2>&1 || true
echo "job exit status: $status"
exit "$status"
