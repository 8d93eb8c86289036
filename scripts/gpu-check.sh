#!/usr/bin/env bash
# The stack on a machine with an NVIDIA GPU, no Docker and no internet (such as this workplace's lent H200
# machine: Python 3.12 with its own CUDA 13 torch, 16 cores), in two halves:
#
#   scripts/gpu-check.sh prepare     HERE, with internet: puts what the GPU machine lacks into build/gpu-check/
#                                    (the Horovod sdist, the build tools' and Horovod's own wheels for Python 3.12)
#   scripts/gpu-check.sh [--cpu]     THERE, offline, with build/gpu-check/ copied along: a venv over the machine's
#                                    own python3 and torch (--system-site-packages), Horovod built with NCCL GPU ops
#                                    by docker/install-horovod.sh gpu (no downloads: pip reads build/gpu-check/
#                                    only), then the checks, each printing its figures and a PASS/FAIL line:
#       1. build        the patched Horovod 0.28.1 with NCCL ops, against the NCCL wheel torch itself loads
#       2. check-build  horovodrun --check-build and horovod.torch: NCCL must be built
#       3. allreduce    scripts/gpu_check_allreduce.py: sum/average/broadcast/allgather checked element by element,
#                       and Horovod's timeline must show the operation expected (NCCL_ALLREDUCE on GPU tensors).
#                       NCCL takes one rank per GPU ("Duplicate GPU detected" otherwise), so on N GPUs the NCCL
#                       check runs N ranks (one GPU: 1 rank, no data crosses between GPUs); the 2-rank checks
#                       run on CPU tensors: Gloo (horovodrun --gloo), and MPI where Open MPI is installed
#       4. trainer      python -m app.train --dataset digits (offline) on the GPU(s), 3 epochs; must train on cuda
#       5. bench        python -m app.bench peers --device cuda, one round, time-limited
#     --cpu (or DEVICE=cpu): the same run without a GPU, for a rehearsal: CPU tensors, the trainer with --no-cuda,
#     peers --short; it builds nothing when the venv already imports horovod.torch (BUILD=yes builds anyway).
#
# Summary: build/gpu-check-run/gpu-check.txt, or $OUT/gpu-check.txt when OUT is set (the device tool returns
# what is under $OUT), beside gpu-check.log (this output), steps.log (each step's full output), peers.md/.json/.png
# and train-metrics.jsonl. The exit status is 0 only when no step failed.
#
# Environment (run):
#   PYTHON                the interpreter whose torch is used (default python3)
#   DEVICE                cuda (default) or cpu (same as --cpu)
#   BUILD                 auto (default: build unless DEVICE=cpu and horovod.torch imports), yes, no
#   MPI                   auto (default: Open MPI's mpirun and mpicxx/mpicc found -> MPI controller built too), no
#                         (Gloo only: HOROVOD_WITHOUT_MPI=1)
#   HOROVOD_CUDA_HOME     the CUDA toolkit (default: the first of /usr/local/cuda, /usr/local/cuda-<torch's major>*,
#                         nvidia/cu<major> beside torch whose nvcc is torch's CUDA major version and has headers)
#   HOROVOD_BUILD_CUDA_CC_LIST   CUDA architectures of Horovod's kernels (default: the first GPU's, e.g. 90;
#                         90 with --cpu), instead of every one nvcc knows: one instead of about ten, a faster build
#   RANKS                 GPU ranks for the NCCL allreduce, the trainer and the bench (default: the number of GPUs)
#   GPU_CHECK_BUDGET_S    seconds for the whole run (default 480); each step's timeout is cut to what is left, and
#                         a step with under 20 s left is skipped
#   GPU_CHECK_BUILD_S     the build's own limit (default 360)
#   GPU_CHECK_PREP, GPU_CHECK_RUN   the folders (default build/gpu-check and build/gpu-check-run)
# Environment (prepare): PREP_PYTHON (pip to download with, default python3), GPU_CHECK_PYTHON_VERSION (3.12),
#   WHEELHOUSE (a folder that may hold the sdist already, default /var/cache/horovod-stack/wheelhouse).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
repo=$PWD
HOROVOD_VERSION="${HOROVOD_VERSION:-0.28.1}"
prep="${GPU_CHECK_PREP:-build/gpu-check}"
run_dir="${GPU_CHECK_RUN:-build/gpu-check-run}"
sdist="horovod-$HOROVOD_VERSION.tar.gz"
say() { echo "[gpu-check] $*"; }
die() { echo "gpu-check: $*" >&2; exit 1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

# --- prepare: here, with internet -----------------------------------------------------------------------------
prepare() {
  local py="${PREP_PYTHON:-python3}" pyver="${GPU_CHECK_PYTHON_VERSION:-3.12}"
  local cached="${WHEELHOUSE:-/var/cache/horovod-stack/wheelhouse}/$sdist"
  mkdir -p "$prep"
  rm -f "$prep"/*.whl "$prep"/PREPARED
  if [ -f "$cached" ]; then
    say "sdist: $cached (cached)"
    cp "$cached" "$prep/"
  elif [ ! -f "$prep/$sdist" ]; then
    say "sdist: downloading $sdist"
    "$py" -m pip download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$prep" || die "pip download of the sdist failed"
  fi
  [ -f "$prep/$sdist" ] || die "no $sdist in $prep"
  # The build tools docker/install-horovod.sh builds with (cmake<4, setuptools, wheel), and Horovod's own
  # dependencies (cffi and pycparser are not on the lent machine), as CPython $pyver x86-64 wheels. On the GPU
  # machine pip takes what is already installed there first and these only for what is missing.
  say "wheels for CPython $pyver, manylinux x86_64: docker/requirements-build.txt and Horovod's dependencies"
  "$py" -m pip download -q --only-binary :all: --python-version "$pyver" --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_28_x86_64 -d "$prep" -r docker/requirements-build.txt \
    'cffi>=1.4.0' cloudpickle psutil pyyaml packaging || die "pip download of the wheels failed"
  (cd "$prep" && { date -u +'prepared %Y-%m-%dT%H:%M:%SZ'; echo "horovod $HOROVOD_VERSION, wheels for CPython $pyver"
                   sha256sum -- *.tar.gz *.whl; } > PREPARED)
  local size tree
  size=$(du -cb "$prep" | tail -1 | cut -f1)
  tree=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
  (cd "$prep" && du -b -- *) | awk '{ printf "  %10d  %s\n", $1, $2 }'
  say "prepared $prep: $(mib "$size") (+ the working tree, $(mib "${tree:-0}"): $(mib $((size + ${tree:-0}))) of the device tool's 64 MiB)"
  say "on the GPU machine: carry $prep and run scripts/gpu-check.sh"
}

case "${1:-}" in
  prepare) prepare; exit ;;
  -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac

# --- run: there, offline --------------------------------------------------------------------------------------
device="${DEVICE:-cuda}"
for arg in "$@"; do
  case "$arg" in
    --cpu) device=cpu ;;
    run) ;;
    *) die "unknown argument $arg (scripts/gpu-check.sh prepare | scripts/gpu-check.sh [--cpu]; --help)" ;;
  esac
done
case "$device" in cpu|cuda) ;; *) die "DEVICE is cuda or cpu, not $device" ;; esac
PYTHON="${PYTHON:-python3}"
build="${BUILD:-auto}"
budget="${GPU_CHECK_BUDGET_S:-480}"
build_s="${GPU_CHECK_BUILD_S:-360}"
deadline=$((SECONDS + budget))
mkdir -p "$run_dir"
run_dir=$(cd "$run_dir" && pwd)
results="${OUT:-$run_dir/out}"
mkdir -p "$results"
results=$(cd "$results" && pwd)
summary="$results/gpu-check.txt"
steps_log="$results/steps.log"
: > "$summary"
: > "$steps_log"
exec > >(tee "$results/gpu-check.log") 2>&1
tee_pid=$!
failed=0

record() {  # record VERDICT STEP TEXT: one line of the summary, printed too
  printf '%-4s %-15s %s\n' "$1" "$2" "$3" | tee -a "$summary"
  [ "$1" = FAIL ] && failed=1
  return 0
}
info() { record INFO "$1" "$2"; }
left() { echo $((deadline - SECONDS)); }
step_timeout() {  # step_timeout MAX: MAX or what is left of the budget less a margin; empty when too little
  local t=$(( $(left) - 10 ))
  [ "$t" -gt "$1" ] && t=$1
  [ "$t" -ge 20 ] && echo "$t"
}
run_step() {  # run_step NAME SECONDS COMMAND...: output into steps.log and $run_dir/NAME.log; 124 = timed out
  local name=$1 seconds=$2 rc
  shift 2
  { echo "===== $name: $*"; } >> "$steps_log"
  timeout -k 10 "$seconds" "$@" > "$run_dir/$name.log" 2>&1
  rc=$?
  cat "$run_dir/$name.log" >> "$steps_log"
  echo "===== $name: exit $rc" >> "$steps_log"
  return $rc
}
why() {  # why RC SECONDS: a failed step's reason
  case "$1" in 124|137) echo "timed out after $2 s" ;; *) echo "exit $1" ;; esac
}
finish() {
  record INFO total "$SECONDS s of a $budget s budget"
  say "summary ($summary):"
  cat "$summary"
  if [ "$failed" = 0 ]; then say "all checks passed"; else say "some checks FAILED (details above and in steps.log)"; fi
  exec >&- 2>&-
  wait "$tee_pid" 2>/dev/null  # gpu-check.log complete before the device tool collects $OUT
  exit "$failed"
}

say "mode: $device; results in $results; budget $budget s"
info host "$(uname -srm), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo) memory"

# --- 0. what this machine has ---------------------------------------------------------------------------------
gpus=0
cc=90
if [ "$device" = cuda ]; then
  if ! command -v nvidia-smi >/dev/null; then
    record FAIL gpu "nvidia-smi not found: no NVIDIA driver here (--cpu rehearses without a GPU)"
    finish
  fi
  while IFS= read -r line; do info gpu "$line"; done \
    < <(nvidia-smi --query-gpu=index,name,driver_version,compute_cap,memory.total --format=csv,noheader)
  gpus=$(nvidia-smi -L | grep -c '^GPU')
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | tr -d ' .' | sort -u | paste -sd, -)
  [ "$gpus" -ge 1 ] || { record FAIL gpu "nvidia-smi lists no GPU"; finish; }
fi
ranks_gpu="${RANKS:-$gpus}"

command -v "$PYTHON" >/dev/null || { record FAIL python "$PYTHON not found (PYTHON=...)"; finish; }
probe=$("$PYTHON" - <<'EOF' 2>&1
import os, site, sys
print("python", sys.version.split()[0], sys.executable, "(a venv)" if sys.prefix != sys.base_prefix else "")
print("sites", os.pathsep.join(site.getsitepackages()))
import sysconfig
include = sysconfig.get_paths()["include"]
print("python_h", "yes" if os.path.exists(os.path.join(include, "Python.h")) else "MISSING", include)
try:
    import torch
except Exception as error:
    print("torch MISSING", error)
    raise SystemExit
nccl = [line.split()[-1] for line in open("/proc/self/maps") if "/libnccl.so" in line]
print("torch", torch.__version__, "cuda", torch.version.cuda or "none", "available", torch.cuda.is_available(),
      "devices", torch.cuda.device_count())
try:
    version = ".".join(map(str, torch.cuda.nccl.version()))
except Exception:
    version = "?"
print("nccl_lib", nccl[0] if nccl else "none", version)
EOF
)
echo "$probe"
torch_line=$(grep '^torch ' <<<"$probe")
info python "$(grep '^python ' <<<"$probe" | cut -d' ' -f2-)"
if [ -z "$torch_line" ] || grep -q MISSING <<<"$torch_line"; then record FAIL torch "$PYTHON cannot import torch"; finish; fi
info torch "${torch_line#torch }"
torch_cuda=$(awk '{print $4}' <<<"$torch_line")
parent_sites=$(grep '^sites ' <<<"$probe" | cut -d' ' -f2-)
python_h=$(grep '^python_h ' <<<"$probe" | cut -d' ' -f2-)
if grep -q '^yes' <<<"$python_h"; then info python.h "${python_h#yes }"
else info python.h "none in ${python_h#MISSING }"; fi
read -r _ nccl_lib nccl_version < <(grep '^nccl_lib ' <<<"$probe")
if [ "$device" = cuda ] && ! grep -q 'available True' <<<"$torch_line"; then
  record FAIL torch "torch sees no GPU (a CPU build, or the driver is too old for CUDA $torch_cuda)"
  finish
fi

tool() {  # tool NAME...: the first found, with its version line
  local name path
  for name in "$@"; do
    path=$(command -v "$name") || continue
    echo "$path ($("$path" --version 2>&1 | grep -m1 -iE 'version|release|[0-9]+\.[0-9]+' | sed 's/^ *//'))"
    return 0
  done
  return 1
}
parent_bin=$(dirname "$("$PYTHON" -c 'import sys; print(sys.executable)')")
PATH="$parent_bin:$PATH"  # the interpreter's own tools first (cmake, ninja), as if its environment were active
missing=()  # what a build needs and this machine lacks
if cxx=$(tool g++ c++ clang++); then info c++ "$cxx"; else missing+=("a C++ compiler (g++, c++, clang++)"); fi
if builder=$(tool make); then info make "$builder"
elif builder=$(tool ninja); then info make "no make; CMake uses ninja: $builder"; export CMAKE_GENERATOR=Ninja
else missing+=("make or ninja"); fi
info cmake "$(tool cmake || echo 'none on PATH (the carried cmake<4 wheel is installed into the venv)')"
command -v perl >/dev/null || missing+=("perl (docker/patch-horovod-source.sh)")

mpi=no
mpi_text="none found"
if [ "${MPI:-auto}" != no ] && command -v mpirun >/dev/null; then
  mpi_text="mpirun: $(mpirun --version 2>&1 | head -1)"
  if ! mpirun --version 2>&1 | grep -q 'Open MPI'; then
    mpi_text+="; not Open MPI (the stack's launchers use Open MPI's flags): not used"
  elif ! command -v mpicxx >/dev/null && ! command -v mpicc >/dev/null; then
    mpi_text+="; no mpicxx/mpicc (MPI's development files): not used"
  else
    mpi=yes
  fi
elif [ "${MPI:-auto}" = no ]; then
  mpi_text="not used (MPI=no)"
fi
if [ "$mpi" = yes ]; then
  info mpi "$mpi_text: Horovod gets the MPI controller and ops too"
else
  info mpi "$mpi_text: Horovod is built with the Gloo controller only (HOROVOD_WITHOUT_MPI=1); MPI checks skipped"
  export HOROVOD_WITHOUT_MPI=1
fi
mpirun_words=(mpirun -np)
[ "$(id -u)" = 0 ] && mpirun_words=(mpirun --allow-run-as-root -np)

# The CUDA toolkit: torch's major version (a CUDA 12 toolkit does not build against a CUDA 13 torch), with headers.
cuda_home=""
if [ "$torch_cuda" != none ]; then
  major=${torch_cuda%%.*}
  IFS=: read -r -a sites <<<"$parent_sites"
  candidates=("${HOROVOD_CUDA_HOME:-}" /usr/local/cuda /usr/local/cuda-"$major"*)
  for site_dir in "${sites[@]}"; do candidates+=("$site_dir/nvidia/cu$major"); done
  for candidate in "${candidates[@]}"; do
    [ -n "$candidate" ] && [ -x "$candidate/bin/nvcc" ] || continue
    release=$("$candidate/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
    if [ "${release%%.*}" != "$major" ]; then
      info cuda "$candidate is CUDA ${release:-?}, torch is built for $torch_cuda: not used"
    elif [ ! -f "$candidate/include/cuda_runtime.h" ]; then
      info cuda "$candidate has nvcc $release but no include/cuda_runtime.h: not used"
    else
      cuda_home=$candidate
      break
    fi
  done
  if [ -n "$cuda_home" ]; then
    info cuda "toolkit $cuda_home (nvcc $release)"
    export HOROVOD_CUDA_HOME="$cuda_home"
    if [ ! -e "$cuda_home/lib64" ] && [ -e "$cuda_home/lib/libcudart.so.$major" ]; then
      # NVIDIA's wheels (nvidia/cu13): the links install-horovod.sh makes for its own copy of them
      if ! { ln -sf "libcudart.so.$major" "$cuda_home/lib/libcudart.so" && ln -s lib "$cuda_home/lib64"; }; then
        info cuda "could not add lib64 and libcudart.so links to $cuda_home"
      fi
    fi
  else
    info cuda "no CUDA $major toolkit with nvcc and headers found (looked at ${candidates[*]})"
  fi
fi
info nccl "torch loads $nccl_lib (NCCL $nccl_version)"

# --- 1. build: the venv, then docker/install-horovod.sh gpu, offline -------------------------------------------
venv="$run_dir/venv"  # absolute: the ranks start it from their own working directory
if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv --system-site-packages --without-pip "$venv" || { record FAIL build "$PYTHON -m venv failed"; finish; }
fi
venv_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# A venv over an interpreter that is itself a venv (the lent machine's python3 is /opt/torch/.venv) sees only the
# base installation's packages: its own site-packages come in through a .pth file, after the venv's.
tr ':' '\n' <<<"$parent_sites" > "$venv_site/_gpu_check_parent.pth"
export PATH="$venv/bin:$PATH" PYTHONPATH="$repo" PIP_DISABLE_PIP_VERSION_CHECK=1
"$venv/bin/python" -c 'import torch' 2>/dev/null || { record FAIL build "the venv $venv cannot import torch"; finish; }
"$venv/bin/python" -m pip --version >/dev/null 2>&1 || { record FAIL build "no pip visible to the venv"; finish; }

has_horovod() { "$venv/bin/python" -c 'import horovod.torch' 2>/dev/null; }
if [ "$build" = auto ]; then
  if [ "$device" = cpu ] && has_horovod; then build=no; else build=yes; fi
fi
built=no
if [ "$build" = no ]; then
  if has_horovod; then
    info build "not building: using $("$venv/bin/python" -c 'import horovod; print(horovod.__version__, horovod.__file__)')"
  else
    record FAIL build "BUILD=no, and horovod.torch does not import"
    finish
  fi
elif ! t=$(step_timeout "$build_s"); then
  record FAIL build "skipped: too little of the budget left"
  finish
elif ! grep -q '^yes' <<<"$python_h" || [ "${#missing[@]}" -gt 0 ]; then
  grep -q '^yes' <<<"$python_h" || missing+=("Python.h (the interpreter's development headers)")
  record FAIL build "cannot build here, missing: $(IFS=';'; echo "${missing[*]}")"
  finish
elif [ ! -f "$prep/$sdist" ]; then
  record FAIL build "no $prep/$sdist: run scripts/gpu-check.sh prepare on a machine with internet, and carry $prep"
  finish
else
  info prep "$prep: $(head -2 "$prep/PREPARED" 2>/dev/null | paste -sd' ' -)"
  offline=(env PIP_NO_INDEX=1 PIP_FIND_LINKS="$(cd "$prep" && pwd)")
  # NCCL: the library torch loads. install-horovod.sh builds against <venv site-packages>/nvidia/nccl, so when
  # that is elsewhere (beside the machine's torch) the venv gets a folder of links to it.
  nccl_home=""
  if [ "$nccl_lib" != none ]; then
    nccl_home=$(dirname "$(dirname "$(readlink -f "$nccl_lib")")")
    [ -f "$nccl_home/include/nccl.h" ] || { info nccl "$nccl_home has no include/nccl.h"; nccl_home=""; }
  fi
  if [ -z "$nccl_home" ]; then
    record FAIL build "no NCCL headers beside the NCCL torch loads ($nccl_lib): NCCL ops cannot be built"
    finish
  fi
  if [ "$(readlink -f "$nccl_home")" != "$(readlink -f "$venv_site/nvidia/nccl" 2>/dev/null)" ]; then
    mkdir -p "$venv_site/nvidia/nccl/lib"
    ln -sfn "$nccl_home/include" "$venv_site/nvidia/nccl/include"
    ln -sf "$(readlink -f "$nccl_lib")" "$venv_site/nvidia/nccl/lib/libnccl.so.2"
  fi
  [ -n "$cuda_home" ] || { record FAIL build "no CUDA toolkit for torch's CUDA $torch_cuda (see the cuda line)"; finish; }
  export HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-$cc}"
  say "1. build: Horovod $HOROVOD_VERSION with NCCL ops (CUDA archs $HOROVOD_BUILD_CUDA_CC_LIST, MPI: $mpi), at most $t s"
  started=$SECONDS
  if ! run_step pip-build-tools 120 "${offline[@]}" "$venv/bin/python" -m pip install -q -r docker/requirements-build.txt; then
    tail -20 "$run_dir/pip-build-tools.log"
    record FAIL build "pip install -r docker/requirements-build.txt from $prep failed"
    finish
  fi
  info cmake "for the build: $(tool cmake)"
  t=$(step_timeout "$build_s") || { record FAIL build "skipped: too little of the budget left"; finish; }
  run_step build "$t" "${offline[@]}" PYTHON="$venv/bin/python" HOROVOD_VERSION="$HOROVOD_VERSION" \
    HOROVOD_WHEEL_CACHE="$run_dir/wheels-mpi-$mpi" docker/install-horovod.sh gpu
  rc=$?
  grep '^\[install-horovod\]' "$run_dir/build.log"
  if [ "$rc" != 0 ]; then
    grep -iE 'error|fatal' "$run_dir/build.log" | head -20
    tail -30 "$run_dir/build.log"
    record FAIL build "docker/install-horovod.sh gpu: $(why "$rc" "$t") after $((SECONDS - started)) s (build.log in steps.log)"
    finish
  fi
  built=yes
  record PASS build "Horovod $HOROVOD_VERSION, NCCL ops, MPI $mpi, CUDA archs $HOROVOD_BUILD_CUDA_CC_LIST, in $((SECONDS - started)) s"
fi

# --- 2. check-build --------------------------------------------------------------------------------------------
say "2. check-build"
need_nccl=no
[ "$device" = cuda ] || [ "$built" = yes ] && need_nccl=yes
run_step check-build 60 horovodrun --check-build
cat "$run_dir/check-build.log"
built_ops=$("$venv/bin/python" -c 'import horovod, horovod.torch as hvd
nccl = hvd.nccl_built()  # the NCCL version it was built with (2.30.7: 23007), 0 without
print(f"horovod {horovod.__version__} from {horovod.__file__}: nccl_built={bool(nccl)} ({nccl}) "
      f"gloo_built={bool(hvd.gloo_built())} mpi_built={bool(hvd.mpi_built())}")' 2>&1 | tail -1)
echo "$built_ops"
if grep -q '\[X\] NCCL' "$run_dir/check-build.log" && grep -q 'nccl_built=True' <<<"$built_ops"; then
  record PASS check-build "NCCL ops built; $built_ops"
elif [ "$need_nccl" = yes ]; then
  record FAIL check-build "no NCCL ops in this Horovod; $built_ops"
else
  record SKIP check-build "no NCCL ops (a CPU rehearsal with $PYTHON's own Horovod); $built_ops"
fi

# --- 3. allreduce ----------------------------------------------------------------------------------------------
allreduce() {  # allreduce NAME LAUNCHER-WORDS... -- CHECK-ARGS...
  local name=$1 t rc words=()
  shift
  while [ "$1" != -- ]; do words+=("$1"); shift; done
  shift
  t=$(step_timeout 120) || { record SKIP "$name" "too little of the budget left"; return; }
  run_step "$name" "$t" env GPU_CHECK_TIMELINE="$run_dir/$name.timeline.json" "${words[@]}" \
    "$venv/bin/python" scripts/gpu_check_allreduce.py --json "$run_dir/$name.json" "$@"
  rc=$?
  grep -E 'allreduce-check|NCCL version|Duplicate GPU|Error|error:' "$run_dir/$name.log" | sed 's/^\[[0-9]*\]<std[a-z]*>://' | head -30
  local line
  line=$(grep -h 'allreduce-check: \(PASS\|FAIL\)' "$run_dir/$name.log" | sed 's/.*allreduce-check: \(PASS\|FAIL\) //' | head -1)
  if [ "$rc" = 0 ] && grep -q 'allreduce-check: PASS' "$run_dir/$name.log"; then
    record PASS "$name" "$line"
  else
    record FAIL "$name" "$(why "$rc" "$t"): ${line:-no result (see steps.log)}"
  fi
}
gloo() { echo horovodrun -np "$1" -H "localhost:$1" --gloo; }
say "3. allreduce"
if [ "$device" = cuda ]; then
  if [ "$ranks_gpu" = 1 ]; then
    info note "one GPU: NCCL takes one rank per GPU (two on one GPU: 'Duplicate GPU detected'), so NCCL is checked\
 with 1 rank (NCCL_ALLREDUCE on the GPU, no data between GPUs); 2-rank collectives on CPU tensors only"
  fi
  # shellcheck disable=SC2046
  allreduce allreduce-nccl env NCCL_DEBUG=VERSION $(gloo "$ranks_gpu") -- --device cuda --expect NCCL \
    --sizes 1000,1048576,67108864 --iters 20
fi
# shellcheck disable=SC2046
allreduce allreduce-gloo $(gloo 2) -- --device cpu --expect GLOO --sizes 1000,1048576 --iters 10
if [ "$mpi" = yes ]; then
  allreduce allreduce-mpi "${mpirun_words[@]}" 2 -bind-to none -x PATH -x PYTHONPATH -x GPU_CHECK_TIMELINE -- \
    --device cpu --expect MPI --sizes 1000,1048576 --iters 10
else
  record SKIP allreduce-mpi "no usable Open MPI (see the mpi line)"
fi

# --- 4. trainer ------------------------------------------------------------------------------------------------
say "4. trainer: digits, 3 epochs"
if [ "$device" = cuda ]; then train_ranks=$ranks_gpu; train_flags=(); want=cuda
else train_ranks=2; train_flags=(--no-cuda); want=cpu; fi
train_dir="$run_dir/train"
rm -rf "$train_dir"
if t=$(step_timeout 150); then
  # shellcheck disable=SC2046
  run_step trainer "$t" env HOROVOD_STACK_GPUS=$([ "$device" = cuda ] && echo 1 || echo 0) $(gloo "$train_ranks") \
    "$venv/bin/python" -m app.train --dataset digits --epochs 3 --progress lines --run-dir "$train_dir" \
    --data-dir "$run_dir/data" "${train_flags[@]}"
  rc=$?
  grep -E 'plan:|epoch|parameters identical|error' "$run_dir/trainer.log" | sed 's/^\[[0-9]*\]<std[a-z]*>://' | tail -15
  figures=$("$venv/bin/python" - "$train_dir/metrics.jsonl" <<'EOF' 2>/dev/null
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
last = rows[-1]
keys = [k for k in last if any(w in k for w in ("epoch", "loss", "acc", "sec", "time", "throughput"))]
print(last.get("val_accuracy", 0))
print(", ".join(f"{k} {last[k]:.4g}" if isinstance(last[k], float) else f"{k} {last[k]}" for k in keys))
EOF
  )
  [ -f "$train_dir/metrics.jsonl" ] && cp "$train_dir/metrics.jsonl" "$results/train-metrics.jsonl"
  accuracy=$(head -1 <<<"$figures")
  figures=$(tail -n +2 <<<"$figures")
  if [ "$rc" = 0 ] && grep -q "ranks on $want" "$run_dir/trainer.log" && [ -f "$train_dir/summary.json" ] &&
     awk -v a="${accuracy:-0}" 'BEGIN { exit !(a >= 0.5) }'; then
    record PASS trainer "$train_ranks rank(s) on $want; last epoch: ${figures:-?}"
  elif [ "$rc" = 0 ]; then
    record FAIL trainer "ran, but not on $want, no summary.json, or validation accuracy under 0.5; last epoch: ${figures:-?}"
  else
    record FAIL trainer "$(why "$rc" "$t"); last epoch: ${figures:-none}"
  fi
else
  record SKIP trainer "too little of the budget left"
fi

# --- 5. peers bench --------------------------------------------------------------------------------------------
say "5. peers bench"
stack=$("$venv/bin/python" -c 'from app.horovod_defaults import HOROVOD_DEFAULTS as d; print(",".join(f"{k}={v}" for k, v in d.items()))')
if [ "$device" = cuda ]; then
  bench_args=(--device cuda --ranks "$ranks_gpu" --models simplenet resnet18 --repeats 1 --steps-scale 4 --threads 4)
  [ "$ranks_gpu" = 1 ] && say "one GPU: 1 rank per configuration, so this measures per-step framework overhead on" \
    "one GPU, not scaling across GPUs"
else
  bench_args=(--device cpu --ranks 2 --short)
fi
[ "$mpi" = yes ] || bench_args+=(--only-variants --variant "hvd-gloo untuned=hvd-gloo" --variant "hvd-gloo stack=hvd-gloo:$stack")
rm -f "$results"/peers.*
if t=$(step_timeout 180); then
  run_step bench "$t" "$venv/bin/python" -m app.bench peers "${bench_args[@]}" --out "$results"
  rc=$?
  grep '^\[peers\]' "$run_dir/bench.log"
  if [ "$rc" = 0 ] && [ -f "$results/peers.json" ]; then
    cat "$results/peers.md"
    best=$(grep '^\[peers\]' "$run_dir/bench.log" | sed 's/^\[peers\] round [0-9/]* *//' | tr -s ' ' | paste -sd ';' -)
    [ "$device" = cuda ] && [ "$ranks_gpu" = 1 ] && best="1 rank each (framework overhead, no scaling): $best"
    record PASS bench "peers ${bench_args[*]:0:4}: $best"
  else
    tail -20 "$run_dir/bench.log"
    record FAIL bench "peers: $(why "$rc" "$t")"
  fi
else
  record SKIP bench "too little of the budget left"
fi
finish
