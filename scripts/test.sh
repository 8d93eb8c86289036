#!/usr/bin/env bash
# The project's test command (README, .ci/run): prepares what the tests need (.venv with the Horovod build,
# the Docker engine and the image), then runs pytest.
#   scripts/test.sh [PYTEST ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build-images.sh
exec .venv/bin/python -m pytest "$@"
