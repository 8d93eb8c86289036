#!/usr/bin/env bash
# The quick-start job on this host: 2 Horovod ranks (Gloo) train SimpleNet on the offline digits set.
#   scripts/train.sh [TRAINER ARGS...]      e.g. scripts/train.sh --dataset synthetic --epochs 3
# RANKS=4 changes the number of ranks. Metrics land in runs/local/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
mkdir -p runs/local
export PATH="$PWD/.venv/bin:$PATH"
ranks="${RANKS:-2}"
exec horovodrun -np "$ranks" -H "localhost:$ranks" --gloo \
  python -m app.train --dataset digits --epochs 5 --metrics-file runs/local/metrics.jsonl \
  --summary-file runs/local/summary.json "$@"
