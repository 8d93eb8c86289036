#!/usr/bin/env bash
# The image's roles:
#   worker              sshd (key-only) on $SSH_PORT, so the job's mpirun can start ranks here; the worker stops
#                       when its job ends, or when the job's driver is lost (below)
#   launcher [ARGS...]  compose's launcher service: the job agent (python -m launcher.agent compose), which waits
#                       for the workers, runs mpirun with the trainer's ARGS or $TRAIN_COMMAND, and exits with it
#   healthcheck         whether this worker's sshd listens (compose's healthcheck)
#   mpijob-worker DIR   a worker pod of a Kubeflow MPIJob (launcher export mpijob): as `worker`, but its sshd takes
#                       the MPI Operator's authorized_keys from DIR (the MPIJob's sshAuthMountPath), copied where
#                       it checks them with the modes StrictModes wants (the operator's files are root-owned, mode
#                       0644, in a folder others may write); its host key is not published (pods share no such
#                       folder): the launcher pod's agent learns it at first contact (launcher/agent/mpijob_pod.py);
#                       it waits for its claim as long as the job may be scheduled (no claim timeout: the operator
#                       removes the workers when the job ends, and the launcher pod's agent holds the clock)
#   mpijob-launcher ARGS  an MPIJob's launcher pod: the job agent (python -m launcher.agent.mpijob_pod ARGS)
#                       runs the job against the operator's /etc/mpi/hostfile and exits with its status
#   smoke [OPTIONS] [-- COMMAND]  a CI runner's check (python -m launcher.smoke): COMMAND, or the bundled trainer,
#                       on N ranks in this container over Gloo; the exit status is the job's. It runs as the owner of
#                       the current folder (the user's mounted checkout, whoever owns it: GitHub's runner 1001,
#                       GitLab's root, anyone): started as root (the image's default, or --user 0) it becomes that
#                       owner with setpriv, so every file it leaves is the owner's, with no capabilities (a root-owned
#                       checkout runs as root without any, and no_new_privs); started as another user it runs as
#                       that user, and says so in one line only if it must write and cannot (its JUnit report). The
#                       harness and the bundled trainer run with the checkout off their import path (python -P)
#   ANY OTHER COMMAND   run it (e.g. `horovodrun --check-build`)
#
# Who runs it: the image starts as root in the image's group (the Dockerfile's USER 0:1000), which only the smoke
# role keeps (to become the checkout's owner); every other role, and any other command, becomes the image's user
# (mpiuser, 1000) first, as the image ran before. A container started with a user of its own (compose's and the
# launcher's workers: 1000; --user 0, whose group is root's; an MPIJob's runAsUser) runs as that user.
#
# Every decision about the job (readiness, host-key pinning, the hostfile, the command line, causes of failure,
# when workers stop) is the job agent's, in launcher/agent/; the defaults and paths this script uses come from
# launcher/core/protocol.py. Worker settings (environment): SSH_PORT; WORKER_ADDRESS (the name this worker's host
# key is published under; default: its address); SSH_LISTEN (comma-separated addresses sshd listens on; default:
# every address); EXIT_WITH_JOB=1 (the multi-host launcher's rank 0: the container
# exits with the job's status); RESTART_ON_FAILURE=1 (a launcher's worker that its engine starts again after it
# failed, --restart-workers: one that stopped by itself stays stopped).
#
# How a worker ends: the job agent holds an ssh connection to it (python -m launcher.agent agent-link). When the job
# ends the agent sends the job-end record down it; when the agent dies instead (its container killed, a reboot), the
# connection closes. Either way agent-link writes $JOB_END_FILE and this script stops sshd, so the container stops. A
# `worker` that no job claims within $DEFAULT_CLAIM_TIMEOUT s of starting stops too (WORKER_CLAIM_TIMEOUT in the
# environment overrides it, 0: never; an mpijob-worker's default is never).
set -euo pipefail

ROLE="${1:-worker}"
log() { echo "[$(date +%H:%M:%S) ${ROLE}] $*"; }

IMAGE_USER=mpiuser
if [ "$ROLE" != smoke ] && [ "$(id -u):$(id -g)" = "0:$(id -g "$IMAGE_USER")" ]; then
  export HOME="/home/$IMAGE_USER"
  exec setpriv --reuid="$IMAGE_USER" --regid="$IMAGE_USER" --init-groups -- "$0" "$@"
fi

run_worker() {
  local operator_keys="${1:-}" keydir="$HOME/.sshd" address started ended="" status=0 keys=() listen=() listen_address
  local claim_timeout
  eval "$(python -m launcher.core.protocol shell)"
  SSH_PORT="${SSH_PORT:-$DEFAULT_SSH_PORT}"
  if [ -n "$operator_keys" ]; then claim_timeout="${WORKER_CLAIM_TIMEOUT:-0}"
  else claim_timeout="${WORKER_CLAIM_TIMEOUT:-$DEFAULT_CLAIM_TIMEOUT}"; fi
  if ! [[ "$claim_timeout" =~ ^[0-9]+$ ]]; then
    log "WORKER_CLAIM_TIMEOUT=$claim_timeout is not whole seconds (0: never); set it to one"
    exit 2
  fi
  mkdir -p "$keydir"
  echo "$SSH_PORT" > "$keydir/port"  # for the healthcheck, which runs often and needs no Python
  [ -f "$keydir/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$keydir/host_ed25519"
  if [ "${RESTART_ON_FAILURE:-0}" = 1 ] && [ -f "$JOB_END_FILE" ]; then
    # Its engine's restart policy (--restart-workers; which workers and how often: launcher/core/restart.py) is
    # for a container that failed (a crash, an out-of-memory kill), which leaves no such file; this one stopped by
    # itself (its job ended, its driver went away, no job claimed it), so it stays stopped.
    ended=$(python -m launcher.core.jobend line "$(cat "$JOB_END_FILE")")
    log "started again after it stopped by itself ($ended); staying stopped"
    exit 0
  fi
  rm -f "$JOB_END_FILE" "$WORKER_CLAIMED"  # a container started again (by hand, compose) waits for a new claim
  if [ -n "$operator_keys" ]; then
    address="${WORKER_ADDRESS:-$(hostname)}"  # the pod's name; the agent reaches it by its DNS name
    install -m 600 "$operator_keys/authorized_keys" "$keydir/authorized_keys"
    keys=(-o "AuthorizedKeysFile=$keydir/authorized_keys")
  else
    address="${WORKER_ADDRESS:-$(hostname -i | awk '{print $1}')}"
    # The agent pins this key: it reads it from the cluster's files, never trusts it over the network.
    cp "$keydir/host_ed25519.pub" "$HOSTKEYS_DIR/.$address.pub.tmp"
    mv "$HOSTKEYS_DIR/.$address.pub.tmp" "$HOSTKEYS_DIR/$address.pub"
  fi
  # SSH_LISTEN (a NIC pinned on host networking): only the job's addresses, not every NIC of the node.
  SSH_LISTEN="${SSH_LISTEN:-}"
  for listen_address in ${SSH_LISTEN//,/ }; do listen+=(-o "ListenAddress=$listen_address"); done
  started=$SECONDS
  log "sshd on $address:$SSH_PORT${SSH_LISTEN:+ (listening on $SSH_LISTEN)}; $([ "$claim_timeout" = 0 ] && echo "waiting for a job's claim" || echo "stops unless a job claims it within $claim_timeout s")"
  /usr/sbin/sshd -D -e -f /opt/horovod-stack/docker/sshd_config -p "$SSH_PORT" \
    -h "$keydir/host_ed25519" -o PidFile="$keydir/sshd.pid" "${keys[@]}" "${listen[@]}" &
  local sshd=$!
  trap 'kill -TERM "$sshd" 2>/dev/null' TERM INT
  while kill -0 "$sshd" 2>/dev/null; do
    if [ -f "$JOB_END_FILE" ]; then
      ended=$(cat "$JOB_END_FILE")
      # After a job's end the grace lets its driver exit first (compose's `up --exit-code-from launcher`).
      if [[ "$ended" == "$LOST_PREFIX"* ]]; then log "${ended#"$LOST_PREFIX"}; stopping"
      else sleep "$WORKER_STOP_GRACE"; log "the job ended ($(python -m launcher.core.jobend line "$ended")); stopping"
      fi
      kill -TERM "$sshd" 2>/dev/null
      break
    fi
    if [ "$claim_timeout" != 0 ] && [ ! -e "$WORKER_CLAIMED" ] && [ $((SECONDS - started)) -ge "$claim_timeout" ]; then
      ended="${LOST_PREFIX}no job claimed this worker within $claim_timeout s"
      echo "$ended" > "$JOB_END_FILE"
      log "${ended#"$LOST_PREFIX"}; stopping"
      kill -TERM "$sshd" 2>/dev/null
      break
    fi
    sleep 1
  done
  wait "$sshd" || status=$?
  [ -n "$operator_keys" ] || rm -f "$HOSTKEYS_DIR/$address.pub"
  if [ -n "$ended" ]; then
    # Lost its driver: not a normal end. Else the job's end: rank 0's container (EXIT_WITH_JOB=1) keeps the job's
    # status as its own; every other worker ended normally.
    status=0
    if [[ "$ended" == "$LOST_PREFIX"* ]]; then status=1
    elif [ "${EXIT_WITH_JOB:-0}" = 1 ]; then status=$(python -m launcher.core.jobend exit-code "$ended"); fi
  fi
  exit "$status"
}

run_smoke() {
  local owner uid home
  owner=$(stat -c %u:%g .)
  if [ "$(id -u)" = 0 ] && ! grep -qE '^CapBnd:[[:space:]]+0+$' /proc/self/status; then
    # The folder's owner, as any process of theirs: no supplementary groups, and no capabilities even as root (a
    # root-owned checkout): empty bounding and inheritable sets, so the exec below leaves none, and no_new_privs, so
    # no setuid or file-capability binary gives any back. The code under test can then plant no setuid binary or
    # device node in the mounted checkout.
    exec setpriv --reuid="${owner%%:*}" --regid="${owner#*:}" --clear-groups --inh-caps=-all --bounding-set=-all \
      --no-new-privs -- "$0" smoke "$@"
  fi
  uid=$(id -u)
  # A uid the image does not know (the runner's 1001) has no home: torch's, matplotlib's and pip's caches go to /tmp.
  home=$(getent passwd "$uid" | cut -d: -f6 || true)
  if [ -n "$home" ] && [ -w "$home" ]; then export HOME="$home"; else export HOME=/tmp/smoke-home; fi
  mkdir -p "$HOME"
  # -P: the checkout (the working folder) stays off the import path, so code under test cannot replace the harness
  # that judges it (a launcher/smoke/ of its own).
  exec python -P -m launcher.smoke "$@"
}

case "$ROLE" in
  worker) run_worker ;;
  launcher) shift; exec python -m launcher.agent compose "$@" ;;
  mpijob-worker) run_worker "${2:?mpijob-worker needs the sshAuthMountPath of the MPIJob, as launcher export mpijob writes it}" ;;
  mpijob-launcher) shift; exec python -m launcher.agent.mpijob_pod "$@" ;;
  smoke) shift; run_smoke "$@" ;;
  healthcheck) port=$(cat "$HOME/.sshd/port") && ss -Hltn "sport = :$port" | grep -q LISTEN ;;
  *) exec "$@" ;;
esac
