#!/usr/bin/env bash
# The quick-start job as a containerized cluster on this host:
#   scripts/compose-up.sh [cpu|gpu]        (default cpu)
# Makes sure the engine and the image are there (scripts/build-images.sh; minutes the first time, seconds
# after), then runs
#   docker compose --profile cpu up --exit-code-from launcher
# which starts the workers and the launcher, trains, and stops the stack when training ends; then removes the
# stopped containers (the shared volume with metrics and checkpoints stays). Exits with the job's status.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-cpu}"
case "$profile" in
  cpu) launcher=launcher ;;
  gpu) launcher=launcher-gpu ;;
  *) echo "usage: $0 [cpu|gpu]" >&2; exit 2 ;;
esac
scripts/build-images.sh
status=0
docker compose --profile "$profile" up --exit-code-from "$launcher" || status=$?
docker compose --profile "$profile" down >/dev/null 2>&1 || true
echo "job exit status: $status (metrics: docker run --rm -v horovod-stack_shared:/shared --entrypoint cat horovod-stack:latest /shared/runs/metrics.jsonl)"
exit "$status"
