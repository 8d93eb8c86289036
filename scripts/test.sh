#!/usr/bin/env bash
# The project's test command (README, .ci/run): prepares what the tests need (.venv with the Horovod build, the Docker
# engine, PyTorch's image and TensorFlow's), checks the code (ruff: lint and format; mypy; vulture: dead code), then
# runs pytest in two processes at once (pytest-xdist, -n 2): the tests on the test hosts on one worker, everything else
# on the other (tests/conftest.py). Pass -n 0 to run them one after the other.
#   scripts/test.sh [PYTEST ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build-images.sh
scripts/build-images.sh tensorflow
scripts/build-sif.sh prune  # the Slurm tests' SIFs of images rebuilt just now: made again when those tests run
echo "[test] ruff, mypy and vulture over app/, launcher/, tests/ and examples/"
.venv/bin/ruff check app launcher tests examples
.venv/bin/ruff format --check app launcher tests examples
.venv/bin/mypy app launcher tests examples
.venv/bin/vulture  # dead code, tests included ([tool.vulture] in pyproject.toml says why twice)
.venv/bin/vulture app launcher examples vulture_whitelist.py  # the product alone: code only a test calls is dead
exec .venv/bin/python -m pytest -n 2 "$@"
