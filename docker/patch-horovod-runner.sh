#!/usr/bin/env bash
# Two fixes to the installed Horovod 0.28.1 runner (pure Python: no rebuild), for elastic jobs, whose ranks
# horovodrun starts over ssh itself:
#   patch-horovod-runner.sh SITE_PACKAGES
# - Pinned host keys: its ssh passed `-o StrictHostKeyChecking=no`, and a command-line option wins over the
#   cluster's ~/.ssh/config, so a worker with any host key was trusted. Without it the pinned known_hosts applies,
#   as for mpirun's ssh and the job agent's (launcher/core/job.py ssh_config).
# - No values on command lines: it put every variable of its environment on each rank's command line (visible in
#   `ps` on the driver's node and on every worker), secret settings included. Now a rank's command line carries only
#   the variables that differ from horovodrun's own environment (the per-rank HOROVOD_* ones and the like); the
#   others reach local ranks by inheritance, as before, and remote ranks through ssh's own channel (SendEnv, which
#   the workers' sshd accepts: docker/sshd_config AcceptEnv).
set -euo pipefail
site="$1"
remote="$site/horovod/runner/util/remote.py"
gloo_run="$site/horovod/runner/gloo_run.py"

sed -i "s/^SSH_COMMAND_PREFIX = 'ssh -o PasswordAuthentication=no -o StrictHostKeyChecking=no'$/SSH_COMMAND_PREFIX = \"ssh -o PasswordAuthentication=no -o 'SendEnv=*'\"  # horovod-stack: pinned keys, env by ssh/" "$remote"
grep -q "horovod-stack: pinned keys" "$remote" && ! grep -q StrictHostKeyChecking "$remote" ||
  { echo "patch-horovod-runner: the ssh command fix no longer applies to $remote" >&2; exit 1; }

sed -i 's/^\( *\)if env_util.is_exportable(key)\]),$/\1if env_util.is_exportable(key) and os.environ.get(key) != value]),  # horovod-stack: inherited or sent by ssh, never on a command line/' "$gloo_run"
grep -q "horovod-stack: inherited or sent by ssh" "$gloo_run" ||
  { echo "patch-horovod-runner: the environment fix no longer applies to $gloo_run" >&2; exit 1; }
python3 -m py_compile "$remote" "$gloo_run"
echo "patch-horovod-runner: patched $remote and $gloo_run"
