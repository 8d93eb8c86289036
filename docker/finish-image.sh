#!/usr/bin/env bash
# The last steps both images share (the Dockerfile's `image` and `tensorflow` stages run this as root, with their
# Horovod wheel at /dist, docker/horovod-runner/ at /tmp/horovod-runner, the wheels context at /wheels, the CA secret
# and docker/requirements-tools.txt mounted):
# - Horovod, its runner patched where installed (pure Python, the wheel stays cached): elastic jobs' ssh pins host
#   keys and puts no environment values on command lines; its rendezvous takes only the job's own requests,
#   unpickles no code and listens on the pinned NIC (docker/horovod-runner/patch.py); `horovodrun --check-build`, which
#   must list NCCL, MPI and Gloo ops, and the framework's own extension must have NCCL;
# - py-spy (docker/requirements-tools.txt), which reads another process's memory: the workers get the SYS_PTRACE
#   capability (launcher/core/protocol.py WORKER_CAPABILITIES, compose.yaml), and the binary may use it as mpiuser,
#   which hosts with Yama's ptrace_scope 1 (Ubuntu's default) require for processes that are not its children;
# - the image's user, mpiuser (1000): every role runs as it, sshd and mpirun included (docker/entrypoint.sh);
# - its folders: /cluster holds the per-cluster SSH trust, filled at run time: the public key (ssh/), rank 0's
#   private key and secrets (private/, never a volume), the workers' host keys (hostkeys/); /shared the datasets,
#   checkpoints and metrics; /workdir the user's code, if any.
set -euo pipefail
pip install --no-deps /dist/horovod-*.whl
python /tmp/horovod-runner/patch.py "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# Both images' Horovod is a GPU build: NCCL, MPI and Gloo ops for the image's framework, or the build stops here.
check=$(horovodrun --check-build)
echo "$check"
framework=$(python -c 'import tensorflow' 2>/dev/null && echo tensorflow || echo torch)
ops=$(sed -n '/Available Tensor Operations:/,$p' <<<"$check")
for op in NCCL MPI Gloo; do
  grep -qE "\[X\] $op\s*$" <<<"$ops" || { echo "finish-image: horovodrun --check-build lists no $op ops" >&2; exit 1; }
done
python -c "import horovod.$framework as hvd; assert hvd.nccl_built(), 'horovod.$framework: no NCCL ops'"
if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi
if [ "${PIP_OFFLINE:-0}" = 1 ]; then export PIP_NO_INDEX=1; fi
pip install -r /tmp/requirements-tools.txt
apt-get update && apt-get install -y --no-install-recommends libcap2-bin && rm -rf /var/lib/apt/lists/*
setcap cap_sys_ptrace+ep "$(readlink -f /opt/venv/bin/py-spy)"
useradd --create-home --uid 1000 --shell /bin/bash mpiuser
mkdir -p /cluster/ssh /cluster/private /cluster/hostkeys /shared /workdir
chown -R mpiuser:mpiuser /cluster /shared /workdir
chmod 700 /cluster/private
