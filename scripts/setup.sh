#!/usr/bin/env bash
# Prepares this checkout on a fresh Debian 12 machine, idempotently: the host (scripts/host-setup.sh: system
# packages, the Docker engine), the virtualenv at .venv with torch, the cached Horovod wheel
# (docker/install-horovod.sh) and the project itself. A second run finds everything in place and takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/host-setup.sh

# A Python 3.11 that can make virtualenvs (the torch wheels on disk are for 3.11; host-setup.sh made sure one exists).
pick_python() {
  for candidate in python3 python3.11; do
    if "$candidate" -c 'import sys, ensurepip; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}
if [ ! -x .venv/bin/python ]; then
  python=$(pick_python) || { echo "setup: no Python 3.11 with venv support; install Python 3.11" >&2; exit 1; }
  echo "[setup] creating .venv with $python"
  "$python" -m venv .venv
fi
if ! .venv/bin/python -c 'import torch, torchvision' 2>/dev/null; then
  echo "[setup] installing torch 2.14.1 and torchvision 0.29.1 (about a minute from local wheels)"
  .venv/bin/pip install -q torch==2.14.1 torchvision==0.29.1
fi
.venv/bin/pip install -q -r docker/requirements-build.txt
PYTHON=.venv/bin/python docker/install-horovod.sh cpu
.venv/bin/pip install -q -e '.[test]'
echo "[setup] ready: $(.venv/bin/python -c 'import horovod, torch; print("horovod", horovod.__version__, "torch", torch.__version__)')"
