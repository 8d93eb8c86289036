#!/usr/bin/env bash
# The project's test command (README, .ci/run): prepares what the tests need, then runs pytest.
#   scripts/test.sh [PYTEST ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
