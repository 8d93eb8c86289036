#!/usr/bin/env bash
# The same training twice, side by side: 2 ranks under mpirun on this host, then 2 worker containers
# under `docker compose up`. Prints each run's median training throughput (epochs 2..N).
#   scripts/bench-container-vs-host.sh            (EPOCHS=8 DATASET=synthetic by default)
# On the host both ranks share memory (Open MPI's shared-memory transport); in containers they talk over
# TCP on the compose bridge, as ranks on different hosts would.
set -euo pipefail
cd "$(dirname "$0")/.."
epochs="${EPOCHS:-8}" dataset="${DATASET:-synthetic}"
work=$(mktemp -d)
project="hst-bench-$$"
trap 'docker compose -p "$project" down -v >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

echo "[bench] host: mpirun -np 2, $dataset, $epochs epochs"
PATH="$PWD/.venv/bin:$PATH" mpirun --allow-run-as-root -np 2 -bind-to none -map-by slot -x PATH \
  python -m app.train --dataset "$dataset" --epochs "$epochs" --metrics-file "$work/host.jsonl" > "$work/host.log" 2>&1

echo "[bench] containers: docker compose up, 2 workers, $dataset, $epochs epochs"
COMPOSE_PROJECT_NAME="$project" DATASET="$dataset" EPOCHS="$epochs" WORKERS=2 \
  docker compose up --exit-code-from launcher > "$work/compose.log" 2>&1
docker run --rm -v "${project}_shared:/shared" --entrypoint cat "${IMAGE:-horovod-stack:latest}" \
  /shared/runs/latest/metrics.jsonl > "$work/containers.jsonl"

.venv/bin/python - "$work/host.jsonl" "$work/containers.jsonl" <<'PY'
import json, statistics, sys
def median_rate(path):
    records = [json.loads(line) for line in open(path)]
    return statistics.median(r["samples_per_sec"] for r in records[1:]), records[-1]["val_accuracy"]
host, containers = median_rate(sys.argv[1]), median_rate(sys.argv[2])
print(f"{'run':<12} {'samples/s':>10} {'val acc':>8}")
print(f"{'host':<12} {host[0]:>10.0f} {host[1]:>8.4f}")
print(f"{'containers':<12} {containers[0]:>10.0f} {containers[1]:>8.4f}")
print(f"containers / host throughput: {containers[0] / host[0]:.2f}")
PY
