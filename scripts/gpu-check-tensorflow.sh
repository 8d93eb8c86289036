#!/usr/bin/env bash
# horovod-stack:tensorflow on this host's NVIDIA GPUs: Horovod's NCCL allreduce through TensorFlow and the bundled
# Keras trainer, on a machine with an NVIDIA GPU, Docker and the NVIDIA Container Toolkit (the PyTorch stack on a
# machine without Docker: scripts/gpu-check.sh).
#
#   scripts/gpu-check-tensorflow.sh
#
# Each step runs in one container of the image with `--gpus all`, its ranks under mpirun with NCCL_DEBUG=INFO, one
# rank per GPU: 2 ranks on 2 or more GPUs; on one GPU 1 rank (NCCL refuses two ranks on one GPU), which the output
# says, since then no data crosses between GPUs. The container's side is scripts/gpu_check_tensorflow.py, mounted.
#   1. allreduce  horovod.tensorflow's allreduce of GPU tensors (4 KB to 64 MB): every sum and average right element
#                 by element; Horovod built with NCCL (hvd.nccl_built()); NCCL's INFO lines show a communicator of
#                 every rank ("Init COMPLETE"); Horovod's timeline shows NCCL_ALLREDUCE
#   2. trainer    python -m app.train --dataset digits --epochs 3 with HOROVOD_STACK_GPUS=1: the plan line says
#                 cuda, metrics.jsonl holds 3 epochs (validation accuracy >= 0.5), the trainer says "parameters
#                 identical on all N ranks" and summary.json holds that one digest for every rank; on 2 ranks NCCL's
#                 lines show the communicator that averaged the gradients
# The last line is the verdict: `gpu-check-tensorflow: passed: ...` (exit 0) or `gpu-check-tensorflow: failed:
# STEP: WHY` (exit 1; 2 when it cannot run: no Docker engine, no image, GPUs that containers do not get). Without
# a GPU (no nvidia-smi, or one that lists none) it says so in one line and exits 0, having checked nothing.
#
# Environment: IMAGE (default horovod-stack:tensorflow); OUT (the results folder, default build/gpu-check-tensorflow:
# gpu-check-tensorflow.log, allreduce.log, trainer.log, and from the container container/: the timeline,
# metrics.jsonl, summary.json, curves.png); GPU_CHECK_STEP_S (each step's limit in seconds, default 300).
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "gpu-check-tensorflow: unknown argument $1 (--help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
repo=$PWD
image="${IMAGE:-horovod-stack:tensorflow}"
step_s="${GPU_CHECK_STEP_S:-300}"
check=/opt/gpu-check/gpu_check_tensorflow.py
verdict() { echo "gpu-check-tensorflow: $*"; }
first_error() { grep -m1 -iE 'error|fail|unsatisf|not found' <<<"$1" || head -1 <<<"$1"; }

# --- what this host has: a GPU, an engine, the image ------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null 2>&1; then
  verdict "no GPU here (no nvidia-smi): nothing checked"; exit 0
fi
if ! host_gpus=$(nvidia-smi -L 2>&1) || ! grep -q '^GPU [0-9]' <<<"$host_gpus"; then
  verdict "no GPU here (nvidia-smi -L: $(head -1 <<<"$host_gpus")): nothing checked"; exit 0
fi
if ! command -v docker >/dev/null 2>&1; then
  verdict "failed: docker: not installed; install Docker (https://docs.docker.com/engine/install/) and the NVIDIA" \
    "Container Toolkit"; exit 2
fi
if ! engine=$(docker info 2>&1 >/dev/null); then
  verdict "failed: docker: no engine answers ($(first_error "$engine")); start it, or run as a member of the" \
    "docker group"; exit 2
fi
if ! docker image inspect "$image" >/dev/null 2>&1; then
  verdict "failed: image: no $image here; build it with scripts/build-images.sh tensorflow (or set IMAGE)"; exit 2
fi
if ! gpus_seen=$(docker run --rm --gpus all "$image" nvidia-smi -L 2>&1) || ! grep -q '^GPU [0-9]' <<<"$gpus_seen"; then
  verdict "failed: gpus: nvidia-smi lists $(grep -c '^GPU [0-9]' <<<"$host_gpus") GPU(s) here, but a container" \
    "of $image gets none ($(first_error "$gpus_seen")); install the NVIDIA Container Toolkit" \
    "(nvidia-ctk runtime configure --runtime=docker, then restart Docker), or update the driver"; exit 2
fi

# --- the steps ----------------------------------------------------------------------------------------------------
out="${OUT:-build/gpu-check-tensorflow}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
log="$out/gpu-check-tensorflow.log"
rm -rf "$out/container"
mkdir -p "$out/container"
chmod 0777 "$out/container"  # the image's user (mpiuser, uid 1000) writes the step's files there
say() { echo "$*" | tee -a "$log"; }
: > "$log"
gpus=$(grep -c '^GPU [0-9]' <<<"$gpus_seen")
gpu_name=$(sed -n 's/^GPU 0: \(.*\) (UUID.*/\1/p' <<<"$gpus_seen")
ranks=$((gpus >= 2 ? 2 : 1))
say "[gpu-check-tensorflow] $image on $gpus GPU(s) ($gpu_name), $ranks rank(s); results in $out"
if [ "$ranks" = 1 ]; then
  say "[gpu-check-tensorflow] one GPU: NCCL takes one rank per GPU, so each step runs 1 rank; NCCL still carries the" \
    "allreduce on that GPU, but no data crosses between GPUs and the trainer's gradients are not allreduced"
fi

failures=""
run_check() {  # run_check STEP: the step in one container, its output in STEP.log, its -check line judged
  local step=$1 rc=0 line why
  say "[gpu-check-tensorflow] $step: $ranks rank(s), up to $step_s s"
  timeout -k 20 "$((step_s + 60))" docker run --rm --init --gpus all --shm-size 1g --ulimit memlock=-1 \
    -v "$repo/scripts/gpu_check_tensorflow.py:$check:ro" -v "$out/container:/out" "$image" \
    python "$check" "$step" --ranks "$ranks" --out /out --timeout "$step_s" > "$out/$step.log" 2>&1 || rc=$?
  { grep -E 'NCCL INFO (NCCL version|.*Init COMPLETE)|NCCL WARN|plan:|epoch [0-9]+/|parameters identical|rror' \
    "$out/$step.log" | grep -v "^$step-check: " || true; } | cut -c1-240 | tail -n 20 | tee -a "$log"
  line=$(grep -E "^$step-check: (PASS|FAIL) " "$out/$step.log" | tail -1 || true)
  [ -z "$line" ] || say "$line"
  [[ "$line" == "$step-check: PASS "* ]] && [ "$rc" = 0 ] && return
  case "$line:$rc" in
    "$step-check: FAIL "*) why=${line#"$step-check: FAIL "} ;;
    *:124) why="timed out after $((step_s + 60)) s (the container's own limit did not stop it; $out/$step.log)" ;;
    *) why="${line:-no verdict from the container}, and docker run exited $rc ($out/$step.log)" ;;
  esac
  failures+="${failures:+; }$step: $why"
}
run_check allreduce
run_check trainer

if [ -n "$failures" ]; then
  say "$(verdict "failed: $failures")"
  exit 1
fi
alone=""
[ "$ranks" = 2 ] || alone=" (one GPU: no data crossed between GPUs)"
say "$(verdict "passed: NCCL allreduce through TensorFlow and the Keras trainer on $ranks rank(s)$alone, $gpus" \
  "GPU(s) ($gpu_name), parameters identical on every rank; logs in $out")"
