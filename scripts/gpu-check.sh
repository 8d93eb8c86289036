#!/usr/bin/env bash
# The stack on a machine with an NVIDIA GPU and no Docker: a venv with the NCCL build of Horovod, then
#   1. horovodrun --check-build (NCCL must be listed),
#   2. the trainer on one GPU (NCCL ops), 2 epochs of the digits set,
#   3. the peers bench on GPU: Horovod (NCCL) vs torch DDP (NCCL), one rank per GPU.
#
#   scripts/gpu-check.sh            (VENV=.venv-gpu OUT=bench-gpu by default; RANKS = the number of GPUs)
#
# Needs: Python 3.11 with venv, g++, cmake (or pip's), Open MPI (openmpi-bin libopenmpi-dev) and the NVIDIA
# driver; the CUDA toolkit comes from NVIDIA's wheels when /usr/local/cuda has none
# (docker/install-horovod.sh). The Horovod build takes minutes once, then is cached.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv-gpu}"
out="${OUT:-bench-gpu}"
python="${PYTHON:-python3.11}"
step() { echo "[gpu-check] $*"; }

command -v nvidia-smi >/dev/null || { echo "gpu-check: nvidia-smi not found: no NVIDIA driver here" >&2; exit 1; }
nvidia-smi -L
gpus=$(nvidia-smi -L | grep -c '^GPU')
ranks="${RANKS:-$gpus}"
[ "$ranks" -ge 1 ] || { echo "gpu-check: no GPU listed by nvidia-smi" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "gpu-check: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 1; }

step "venv $venv: torch (CUDA build from PyPI), then Horovod with NCCL ops"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q torch==2.14.1 torchvision==0.29.1
"$venv/bin/python" -m pip install -q -r docker/requirements-build.txt
"$venv/bin/python" -m pip install -q -r docker/requirements-runtime.txt pytest
PATH="$PWD/$venv/bin:$PATH" PYTHON="$PWD/$venv/bin/python" \
  HOROVOD_WHEEL_CACHE="${HOROVOD_WHEEL_CACHE:-$HOME/.cache/horovod-stack/wheels}" docker/install-horovod.sh gpu

export PATH="$PWD/$venv/bin:$PATH" PYTHONPATH="$PWD"
"$venv/bin/python" -c 'import torch; assert torch.cuda.is_available(), "torch sees no GPU"; print("torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name(0))'

step "1. horovodrun --check-build"
check=$(horovodrun --check-build)
echo "$check"
grep -q '\[X\] NCCL' <<<"$check" || { echo "gpu-check: this Horovod has no NCCL ops" >&2; exit 1; }

step "2. the trainer on one GPU (NCCL), digits, 2 epochs"
root_flag=()
[ "$(id -u)" = 0 ] && root_flag=(--allow-run-as-root)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpirun "${root_flag[@]}" -np 1 -bind-to none -map-by slot -x PATH -x PYTHONPATH -x NCCL_DEBUG=INFO \
  python -m app.train --dataset digits --epochs 2 --metrics-file "$work/metrics.jsonl" \
  --summary-file "$work/summary.json" --checkpoint-dir "$work/checkpoints" --data-dir "$work/data"
cat "$work/summary.json"; echo

step "3. the peers bench on GPU: $ranks rank(s), one GPU each"
python -m app.bench peers --device cuda --ranks "$ranks" --threads 4 --repeats 3 --out "$out"
step "done: $out/peers.md, .json, .png"
