#!/usr/bin/env bash
# The image's roles:
#   worker              run sshd (key-only) on $SSH_PORT so the launcher's mpirun can start ranks here
#   launcher [ARGS...]  make the cluster's SSH key pair, wait for every worker, write the hostfile and run
#                       mpirun with $TRAIN_COMMAND, or the trainer (python -m app.train ARGS... $TRAIN_ARGS);
#                       exits with its status
#   discover            elastic host discovery (docker/discover-hosts.sh): "ADDRESS:SLOTS" per worker answering ssh
#   ANY OTHER COMMAND   run it (e.g. `horovodrun --check-build`)
#
# Settings (environment):
#   SSH_PORT            sshd port on workers (default 12345)
#   WORKER_HOSTS        launcher: comma-separated worker addresses; or else
#   WORKER_SERVICE, WORKERS   launcher: a DNS name that resolves to every worker (compose's service name)
#                       and how many addresses to wait for (default: worker, 2)
#   SLOTS_PER_WORKER    ranks per worker (default 1)
#   NETWORK_INTERFACE   NIC for Open MPI, NCCL and Gloo traffic (default: let each choose)
#   READY_TIMEOUT       seconds to wait for the workers (default 180)
#   TRAIN_ARGS          extra trainer flags, split on spaces
#   TRAIN_COMMAND       launcher: a command line every rank runs instead of python -m app.train ARGS
#   WORKDIR             launcher: when set, the ranks run in /workdir (compose mounts the user's folder there)
#   RUN_ID              launcher: the bundled trainer's run folder is /shared/runs/RUN_ID (default: a new ID per
#                       run; /shared/runs/latest points at the newest)
#   RESULTS_HINT        launcher: where the job's results can be read, printed as its last line
#   ELASTIC_MIN_WORKERS launcher: elastic training (horovodrun, Gloo) that goes on while this many workers remain
#   ELASTIC_TIMEOUT     launcher, elastic: seconds to wait below the minimum before the job fails (default 60)
#
#   EXIT_WITH_JOB=1     worker: exit with the job's status when it ends (the multi-host launcher's rank 0)
#
# Workers stop when their job ends: /cluster/ssh/job-ended appears ("exit status N"), written by compose's
# launcher role into a volume the workers mount, or over ssh by the multi-host launcher's detached job, on
# every exit, success or failure; each worker's sshd then exits and its container stops.
set -euo pipefail

SSH_PORT="${SSH_PORT:-12345}"
CLUSTER_SSH=/cluster/ssh
HOSTKEYS=/cluster/hostkeys
JOB_END_FILE="$CLUSTER_SSH/job-ended"
log() { echo "[$(date +%H:%M:%S) ${ROLE}] $*"; }

run_worker() {
  local keydir="$HOME/.sshd"
  mkdir -p "$keydir"
  [ -f "$keydir/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$keydir/host_ed25519"
  # The launcher pins this key: it reads it from the shared cluster volume, never trusts it over the network.
  local address started
  address="${WORKER_ADDRESS:-$(hostname -i | awk '{print $1}')}"
  cp "$keydir/host_ed25519.pub" "$HOSTKEYS/.$address.pub.tmp"
  mv "$HOSTKEYS/.$address.pub.tmp" "$HOSTKEYS/$address.pub"
  started=$(date +%s)
  log "sshd on $address:$SSH_PORT"
  /usr/sbin/sshd -D -e -f /opt/horovod-stack/docker/sshd_config -p "$SSH_PORT" \
    -h "$keydir/host_ed25519" -o PidFile="$keydir/sshd.pid" &
  local sshd=$!
  trap 'kill -TERM "$sshd" 2>/dev/null' TERM INT
  # A worker lives as long as its job: the launcher writes $JOB_END_FILE when the job ends, however it ends.
  # One from an earlier run (older than this worker) does not count.
  local ended="" status=0
  while kill -0 "$sshd" 2>/dev/null; do
    if [ -f "$JOB_END_FILE" ] && [ "$(stat -c %Y "$JOB_END_FILE")" -ge "$started" ]; then
      # The grace lets the launcher exit first, so `up --exit-code-from launcher` reports the job's status.
      sleep "${WORKER_STOP_GRACE:-2}"
      ended=$(cat "$JOB_END_FILE" 2>/dev/null || true)
      log "the job ended (${ended:-no status}); stopping"
      kill -TERM "$sshd" 2>/dev/null
      break
    fi
    sleep 1
  done
  wait "$sshd" || status=$?
  rm -f "$HOSTKEYS/$address.pub"
  if [ -n "$ended" ]; then
    # Stopped because the job ended: the launcher's rank-0 container (EXIT_WITH_JOB=1) keeps the job's status
    # as its own; every other worker ended normally.
    status=0
    if [ "${EXIT_WITH_JOB:-0}" = 1 ] && [[ "$ended" =~ ^exit\ status\ ([0-9]+) ]]; then status="${BASH_REMATCH[1]}"; fi
  fi
  exit "$status"
}

make_cluster_key() {
  # A fresh key pair for this cluster run; workers read authorized_keys on every login.
  local tmp
  tmp=$(mktemp -d "$CLUSTER_SSH/.new.XXXXXX")
  ssh-keygen -q -t ed25519 -N '' -C "horovod-stack cluster" -f "$tmp/id_ed25519"
  mv "$tmp/id_ed25519" "$CLUSTER_SSH/id_ed25519"
  mv "$tmp/id_ed25519.pub" "$CLUSTER_SSH/id_ed25519.pub"
  cp "$CLUSTER_SSH/id_ed25519.pub" "$CLUSTER_SSH/authorized_keys"
  rmdir "$tmp"
  mkdir -p "$HOME/.ssh"
  chmod 700 "$HOME/.ssh"
  cat > "$HOME/.ssh/config" <<CONFIG
Host *
  Port $SSH_PORT
  IdentityFile $CLUSTER_SSH/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $HOME/.ssh/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 5
  LogLevel ERROR
CONFIG
  : > "$HOME/.ssh/known_hosts"
}

worker_addresses() {
  if [ -n "${WORKER_HOSTS:-}" ]; then
    tr ',' '\n' <<< "$WORKER_HOSTS"
  else
    getent ahostsv4 "${WORKER_SERVICE:-worker}" | awk '{print $1}' | sort -u
  fi
}

# Pins the host key a worker published in the cluster volume (never trusted over the network); a worker that
# came back at the same address with a new key replaces the old line.
pin_host_key() {
  local address="$1" line
  [ -f "$HOSTKEYS/$address.pub" ] || return 1
  line="[$address]:$SSH_PORT $(cut -d' ' -f1,2 "$HOSTKEYS/$address.pub")"
  grep -qxF "$line" "$HOME/.ssh/known_hosts" 2>/dev/null && return 0
  ssh-keygen -q -R "[$address]:$SSH_PORT" -f "$HOME/.ssh/known_hosts" >/dev/null 2>&1 || true
  echo "$line" >> "$HOME/.ssh/known_hosts"
}

# Elastic Horovod's host discovery (horovodrun runs it about once a second): one ADDRESS:SLOTS line per worker
# whose sshd answers right now, in a stable order. A lost worker drops out; a new or restarted one comes in.
# Horovod gives the lowest ranks to the hosts it has known longest, but takes the hosts of its first discovery
# as a set, in no order: so a job's first answer names the first candidate alone (the multi-host launcher's
# rank-0 node, whose volume holds the run's metrics) and later answers name them all.
discover_hosts() {
  local address first_answered="/tmp/.elastic-discovery-${ELASTIC_JOB:-job}"
  while read -r address; do
    [ -n "$address" ] || continue
    pin_host_key "$address" || true  # the multi-host launcher pinned its nodes' keys at start
    if ssh -o ConnectTimeout=2 "$address" true < /dev/null 2>/dev/null; then
      echo "$address:${SLOTS_PER_WORKER:-1}"
      [ -e "$first_answered" ] || { touch "$first_answered"; break; }
    fi
  done < <(worker_addresses)
}

wait_for_workers() {
  local expected="$1" deadline=$((SECONDS + ${READY_TIMEOUT:-180})) addresses ready last=""
  while true; do
    mapfile -t addresses < <(worker_addresses)
    ready=()
    for address in "${addresses[@]}"; do
      pin_host_key "$address" || continue
      ssh "$address" true 2>/dev/null && ready+=("$address")
    done
    local status="${#ready[@]}/$expected workers answer over ssh (${ready[*]:-none yet})"
    [ "$status" != "$last" ] && log "$status" && last="$status"
    if [ "${#ready[@]}" -ge "$expected" ]; then
      READY_WORKERS=("${ready[@]:0:$expected}")
      return 0
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "error: only ${#ready[@]} of $expected workers answered ssh on port $SSH_PORT within ${READY_TIMEOUT:-180} s;" \
          "check that the workers run (docker compose ps) and that WORKERS matches them"
      return 1
    fi
    sleep 1
  done
}

run_launcher() {
  local expected slots hostfile="$HOME/hostfile"
  if [ -n "${WORKER_HOSTS:-}" ]; then expected=$(tr ',' '\n' <<< "$WORKER_HOSTS" | grep -c .); else expected="${WORKERS:-2}"; fi
  slots="${SLOTS_PER_WORKER:-1}"
  rm -f "$JOB_END_FILE"
  trap 'end_job $?' EXIT
  local elastic=()
  if [ -n "${ELASTIC_MIN_WORKERS:-}" ]; then
    if ! [[ "$ELASTIC_MIN_WORKERS" =~ ^[0-9]+$ ]] || [ "$ELASTIC_MIN_WORKERS" -lt 1 ] || [ "$ELASTIC_MIN_WORKERS" -gt "$expected" ]; then
      log "error: ELASTIC_MIN_WORKERS=$ELASTIC_MIN_WORKERS is not a whole number from 1 to WORKERS ($expected);" \
          "fix it in .env, or leave it empty for a fixed-size job"
      exit 2
    fi
    elastic=(--elastic-min-ranks $((ELASTIC_MIN_WORKERS * slots)) --slots-per-host "$slots" --ssh-port "$SSH_PORT"
             --elastic-timeout "${ELASTIC_TIMEOUT:-60}" --job-id "$(date +%s)-$$")
  fi
  if [ -z "${TRAIN_COMMAND:-}" ]; then
    RUN_DIR="/shared/runs/${RUN_ID:-$(date -u +%Y%m%d-%H%M%S)-$(od -An -N2 -tx1 /dev/urandom | tr -d ' \n')}"
    mkdir -p "$RUN_DIR" && ln -sfn "$(basename "$RUN_DIR")" /shared/runs/latest
  fi
  make_cluster_key
  wait_for_workers "$expected"
  : > "$hostfile"
  for address in "${READY_WORKERS[@]}"; do echo "$address slots=$slots" >> "$hostfile"; done

  # The command line comes from the multi-host launcher's tested plan (launcher/plan.py), so both doors agree.
  local plan_args=(--ranks $((expected * slots)) --hostfile "$hostfile" --network-interface "${NETWORK_INTERFACE:-}"
                   "${elastic[@]}")
  if [ -n "${WORKDIR:-}" ]; then plan_args+=(--workdir /workdir); fi
  if [ -n "${RUN_DIR:-}" ]; then plan_args+=(--run-dir "$RUN_DIR"); fi
  local job=()
  if [ -n "${TRAIN_COMMAND:-}" ]; then
    job=(--command-line "$TRAIN_COMMAND")
  else
    # shellcheck disable=SC2206  # TRAIN_ARGS is split on spaces on purpose
    job=(-- "$@" ${TRAIN_ARGS:-})
  fi
  local command=() probe=() why
  mapfile -d '' -t command < <(python -m launcher.job_argv "${plan_args[@]}" "${job[@]}")
  [ "${#command[@]}" -gt 0 ] || { log "error: could not build the mpirun command line"; exit 2; }
  # Every worker runs the same image and mounts: if the first one cannot start the command, none can.
  mapfile -d '' -t probe < <(python -m launcher.job_argv "${plan_args[@]}" --probe "${job[@]}")
  local cwd="${WORKDIR:+/workdir}"
  if ! why=$(ssh "${READY_WORKERS[0]}" "cd ${cwd:-~} && $(printf '%q ' "${probe[@]}")" 2>&1); then
    log "error: cannot start \`${TRAIN_COMMAND:-the trainer}\` in ${cwd:-the home folder} on the workers: $why;" \
        "set WORKDIR to the folder that holds your code, or use an image FROM horovod-stack:latest that has it"
    exit 2
  fi
  log "hostfile: $(paste -sd' ' "$hostfile" | sed 's/ slots=/:/g')"
  log "running: ${command[*]}"
  local status=0 program=mpirun
  [ "${#elastic[@]}" -eq 0 ] || program=horovodrun
  "${command[@]}" || status=$?
  log "$program exited with status $status"
  if [ "$status" != 0 ] && [ "${#elastic[@]}" -gt 0 ]; then
    local answering lost=()
    answering=$(discover_hosts)
    for address in "${READY_WORKERS[@]}"; do
      grep -q "^$address:" <<< "$answering" || lost+=("$address")
    done
    [ "${#lost[@]}" -eq 0 ] ||
      log "error: the job fell below ELASTIC_MIN_WORKERS=$ELASTIC_MIN_WORKERS for ${ELASTIC_TIMEOUT:-60} s: lost" \
          "worker(s) ${lost[*]}; see \`docker compose ps -a\` for how they ended"
  fi
  exit "$status"
}

# Runs on every exit of the launcher role: tells the workers to stop (they watch $JOB_END_FILE) and says how the
# job ended and where its results are.
end_job() {
  local status="$1"
  trap - EXIT
  echo "exit status $status" > "$JOB_END_FILE.tmp" && mv "$JOB_END_FILE.tmp" "$JOB_END_FILE"
  if [ "$status" = 0 ]; then
    log "job succeeded (exit status 0); the workers stop now"
  else
    log "job FAILED (exit status $status); the workers stop now"
  fi
  if [ -n "${RUN_DIR:-}" ]; then
    log "results: $RUN_DIR (metrics.jsonl, curves.png, tb/, checkpoints/)${RESULTS_HINT:+ in $RESULTS_HINT}"
  elif [ -n "${RESULTS_HINT:-}" ]; then
    log "results: $RESULTS_HINT"
  fi
  exit "$status"
}

ROLE="${1:-worker}"
case "$ROLE" in
  worker) run_worker ;;
  launcher) shift; [ "${1:-}" = "--" ] && shift; run_launcher "$@" ;;
  discover) discover_hosts ;;
  *) exec "$@" ;;
esac
