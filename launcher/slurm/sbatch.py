"""The Slurm batch script: a job as `sbatch` runs it, every rank a Slurm task running the stack's image from a SIF
under Apptainer.

Pure: from an SbatchRequest (what `launcher export sbatch` was given: the allocation, the SIF, the shared folder, and
the JobOptions every launch method builds) to the script's text. Nothing here talks to a cluster. What the script
says, and why:
- #SBATCH lines for the allocation: the nodes, one task per rank (--ntasks-per-node: the slots, or one per GPU with
  --gpus-per-node), the partition, the account, the time limit (--time), the output file (NAME-JOBID.out in the
  folder sbatch ran in) and the submitting environment (--export=ALL: the secrets' values come from it);
- the ranks: srun starts every rank as a task (rank_start, the one place that says how), each in the SIF with the
  shared folder at /shared (and the user's --workdir at /workdir, their cwd); Horovod's Gloo controller finds the
  ranks through Horovod's rendezvous server, which the script starts on the allocation's first node with a secret of
  the run; a rank that fails ends the job (--kill-on-bad-exit);
- the environment: `apptainer exec --cleanenv` keeps only APPTAINERENV_ variables (and TERM, proxies), so no variable
  of the submitting shell (a PYTHONPATH, a module's LD_PRELOAD) reaches a rank, and the image's own values (Docker's
  ENV, which a host variable of the same name would otherwise replace) hold; every rank gets the user's --env, the
  stack's Horovod defaults, NIC settings, GPU settings, timeline and autotuning, as the other launch methods give
  them, as APPTAINERENV_ variables; each task hands its rank and Slurm's own variables (its GPUs among them) into its
  container itself;
- secrets by name: the script takes each one's value from its environment at run time and stops, naming it, when
  one is missing; no value is ever in the script;
- --max-restarts N: the job is requeued when Slurm loses a node (--requeue, the output file appended to) and each
  run resumes from the newest checkpoint (the bundled trainer's --resume; a script of the user's reads
  HOROVOD_STACK_RESTART, from SLURM_RESTART_COUNT), N times at most, the ranks waiting on a lost peer until Slurm
  declares its node lost (a rank that failed first would end the job, not requeue it); without it, --no-requeue, so
  a site that requeues by default does not start the job over from scratch.
- --stall-timeout N: a watch beside the ranks (stall_lines): once the job's output and metrics file have not changed
  for N s, every rank's stack goes into the output, taken in the job's own allocation; --stall-action fail then ends
  the ranks, and the job FAILED.
Open MPI is not started (the ranks' controller is Gloo), so neither its NIC settings nor its fixed ports
(launcher/core/mpiports.py, which let a Docker host's firewall name the ports of the stack's workers) apply.
"""

from __future__ import annotations

import shlex

from app.gpu import gpu_rank_env
from launcher.core.jobspec import defaults_unless_set, horovod_outputs, rank_command, run_paths, trainer_with
from launcher.core.nics import nic_selection
from launcher.core.options import names_in
from launcher.core.protocol import CHECKPOINT_DIR_VARIABLE, RESTART_VARIABLE, RUNS_DIR, SHARED_MOUNT, WORKDIR
from launcher.slurm.sbatch_request import SbatchRequest

JOB_ID, RESTART, GLOO_TIMEOUT = "\0job\0", "\0restart\0", "\0gloo timeout\0"
"""Parts of a word known only when the job runs (no argument holds a NUL): written as the shell variables below."""
AT_RUN_TIME = {JOB_ID: '"${SLURM_JOB_ID}"', RESTART: '"${SLURM_RESTART_COUNT:-0}"', GLOO_TIMEOUT: '"${gloo_timeout}"'}
GLOO_TIMEOUT_VARIABLE = "HOROVOD_GLOO_TIMEOUT_SECONDS"
BATCH_STALL = "launcher.agent.batch_stall"
"""The stall watch's commands in the SIF (stall_lines)."""
SLURMD_TIMEOUT_DEFAULT = 300
"""Slurm's SlurmdTimeout where `scontrol show config` does not tell it."""
OUTPUT_FILE = "%x-%j.out"
"""sbatch's pattern for the job's output file: the job's name and ID, in the folder sbatch ran in."""
TASK_ENV = (
    "export APPTAINERENV_HOROVOD_RANK=$SLURM_PROCID APPTAINERENV_HOROVOD_SIZE=$SLURM_NTASKS "
    "APPTAINERENV_HOROVOD_LOCAL_RANK=$SLURM_LOCALID APPTAINERENV_HOROVOD_LOCAL_SIZE=$SLURM_NTASKS_PER_NODE "
    "APPTAINERENV_HOROVOD_CROSS_RANK=$SLURM_NODEID APPTAINERENV_HOROVOD_CROSS_SIZE=$SLURM_NNODES "
    "APPTAINERENV_HOROVOD_HOSTNAME=$SLURMD_NODENAME; "
    'for name in ${!SLURM_@} CUDA_VISIBLE_DEVICES; do [ -n "${!name+x}" ] && export "APPTAINERENV_$name=${!name}"; '
    'done; exec "$@"'
)
"""What each task runs before Apptainer: its rank, as Horovod's Gloo controller reads it, from Slurm's numbering of
the task (srun's block distribution puts a node's ranks side by side, as the rendezvous server assigns them), and
Slurm's variables of this task (the GPUs Slurm gave it among them), which --cleanenv would drop, handed into its
container."""
COLLECT = 'python -m launcher.agent.stacks collect --node "$SLURMD_NODENAME" --only "SLURM_JOB_ID=$SLURM_JOB_ID"'
STACKS_TASK = f"""mine=$(readlink /proc/self/ns/user) entered=" " own=
for environ in /proc/[0-9]*/environ; do
  mapfile -d '' -t variables 2>/dev/null <"$environ" || continue
  job= rank= kept=()
  for variable in "${{variables[@]}}"; do
    case $variable in
      HOROVOD_RANK=*) rank=1 ;;
      "SLURM_JOB_ID=$SLURM_JOB_ID") job=1; kept+=("$variable") ;;
      *) kept+=("$variable") ;;
    esac
  done
  [ -n "$job" ] && [ -n "$rank" ] || continue
  pid=${{environ#/proc/}} pid=${{pid%/environ}}
  namespace=$(readlink "/proc/$pid/ns/user") || continue
  if [ "$namespace" = "$mine" ]; then own=1; continue; fi
  case $entered in *" $namespace "*) continue ;; esac
  entered+="$namespace "
  (  # the rank's variables (PATH, PYTHONPATH) in the environment, never on a command line
    for variable in "${{kept[@]}}"; do export "$variable" 2>/dev/null || true; done
    exec nsenter --target "$pid" --user --mount --preserve-credentials --wd -- {COLLECT}
  )
done
if [ -n "$own" ]; then apptainer exec --cleanenv "$0" {COLLECT}; fi
"""
"""What each node's task of the stall watch runs (stall_lines), on the node itself, $0 the SIF: stacks.py's `collect`
of this job's ranks there, found by their variables (HOROVOD_RANK, and this job's SLURM_JOB_ID). Apptainer run by a
user without setuid puts each rank in a user namespace of its own, whose processes another container of the same
user may neither read nor trace (the kernel asks for SYS_PTRACE there); so `collect` runs inside each rank's
namespaces (nsenter: the user owns them), with the rank's variables less its rank. Ranks in the node's own user
namespace (setuid Apptainer) are read from one container of the SIF."""
RENDEZVOUS_SERVER = """import os, time
from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.http.http_server import RendezvousServer
server = RendezvousServer()
port = server.start(address=os.environ["RENDEZVOUS_ADDRESS"])
hosts = parse_hosts(os.environ["RENDEZVOUS_HOSTS"])
server.init(get_host_assignments(hosts, int(os.environ["RENDEZVOUS_RANKS"])))
print(port, flush=True)
while True:
    time.sleep(3600)
"""
"""Horovod's rendezvous server, as horovodrun starts it for Gloo: it hands each rank its peers; it prints its port.
It listens on one address and, in the stack's image, answers only requests with the run's secret
(HOROVOD_STACK_RENDEZVOUS_TOKEN: docker/horovod-runner/stack_guard.py)."""
RENDEZVOUS_WAIT_SECONDS = 60
"""How long the script waits for the server to start (Apptainer mounting the SIF, Python importing Horovod)."""


def shell_word(word: str) -> str:
    """`word` as one shell word: quoted, its parts known at run time (JOB_ID, RESTART) as their variables."""
    for mark, variable in AT_RUN_TIME.items():
        if mark in word:
            return variable.join(shell_word(part) if part else "" for part in word.split(mark))
    return shlex.quote(word)


def run_folder(request: SbatchRequest) -> str:
    """The run's folder in the containers: its own under RUNS_DIR, by the job's name and Slurm's job ID, which a
    requeued job keeps (so a restart finds its checkpoints)."""
    return f"{RUNS_DIR}/{request.name}-{JOB_ID}"


def passed_on(argv: list[str]) -> list[str]:
    """The KEY=VALUE pairs of mpirun's `-x KEY=VALUE` arguments: what mpirun would hand every rank (Open MPI's own
    `--mca` settings are left out: the ranks' Gloo controller never starts it)."""
    return [argv[index + 1] for index, word in enumerate(argv[:-1]) if word == "-x"]


def rank_env(request: SbatchRequest) -> list[str]:
    """KEY=VALUE for every rank: the user's --env, NCCL's and Gloo's NIC (jobspec's nic_selection, as mpirun would
    pass them on), the stack's Horovod defaults they leave unset, the timeline and autotuning, the GPU settings, and
    with restarts which run this is, where its checkpoints are and how long a rank waits on a silent peer
    (restart_lines' gloo_timeout)."""
    options = request.job
    env, user_set = options.env, names_in(options.env)
    paths = run_paths(options.command, run_folder(request), options.can_restart)
    nic = passed_on(nic_selection(options.network_interface, (), request.nodes > 1, user_set))
    restart = (
        {RESTART_VARIABLE: RESTART, CHECKPOINT_DIR_VARIABLE: paths.checkpoint_dir, GLOO_TIMEOUT_VARIABLE: GLOO_TIMEOUT}
        if options.can_restart
        else {}
    )
    return [
        *env,
        *(pair for pair in nic if pair.partition("=")[0] not in user_set),
        *defaults_unless_set(env),
        *horovod_outputs(options.timeline, options.autotune, output_folder(request), user_set),
        *(gpu_rank_env(user_set) if request.gpus_per_node else ()),
        *(f"{name}={value}" for name, value in restart.items() if value and name not in user_set),
    ]


def resumes(request: SbatchRequest) -> bool:
    """The bundled trainer, with restarts and somewhere to keep checkpoints, is given --resume after a requeue."""
    options = request.job
    paths = run_paths(options.command, run_folder(request), options.can_restart)
    return paths.trainer and bool(paths.checkpoint_dir) and "--resume" not in options.command


def rank_words(request: SbatchRequest) -> list[str]:
    """What every rank runs, as shell words: the command (the bundled trainer in its run folder, --resume after a
    requeue), behind RANK_NIC where the NIC is a subnet (jobspec's rank_command)."""
    options = request.job
    command = trainer_with(options.command, "--run-dir", run_folder(request))
    wrapped = rank_command(command, options.network_interface, names_in(options.env))
    words = [shell_word(word) for word in wrapped]
    # ${resume[@]+...}: an empty array under `set -u` (bash before 4.4 calls it unbound)
    return [*words, '${resume[@]+"${resume[@]}"}'] if resumes(request) else words


def rendezvous_address(request: SbatchRequest) -> str:
    """The shell that finds the address the rendezvous server listens on: the pinned NIC's on this node, else the
    address this node's name resolves to (a subnet for a NIC: that one too)."""
    nic = request.job.network_interface
    if nic and "/" not in nic:
        return f"$(ip -4 -o addr show dev {shlex.quote(nic)} | awk '{{split($4, a, \"/\"); print a[1]; exit}}')"
    return "$(getent hosts \"$(hostname)\" | awk '{print $1; exit}')"


def bind_words(request: SbatchRequest) -> list[str]:
    """Apptainer's --bind words for the job's folders: the shared folder at /shared, the --workdir at /workdir, the
    --mounts."""
    options = request.job
    binds = [f"{request.shared}:{SHARED_MOUNT}", *([f"{options.workdir}:{WORKDIR}"] if options.workdir else [])]
    binds += list(options.mounts)
    return [word for bind in binds for word in ("--bind", shlex.quote(bind))]


def rank_start(request: SbatchRequest, command: list[str]) -> list[str]:
    """The lines that start every rank, the one place that says how. Horovod's rendezvous server starts on this node
    (the allocation's first) with a secret of this run; then srun starts one task per rank over the allocation (no
    CPU binding, as mpirun's `-bind-to none`; --label puts each line after its task number, which is its rank), each
    task setting its rank for Horovod's Gloo controller (TASK_ENV) and running `command` (shell words) in the SIF.
    Neither PMIx nor ssh: Debian's Slurm has no PMIx plugin and the image's Open MPI no PMI-2 client (tried on the
    test suite's Slurm cluster), and Gloo needs only TCP between the nodes."""
    options = request.job
    apptainer = ["apptainer", "exec", "--cleanenv", *(["--nv"] if request.gpus_per_node else []), *bind_words(request)]
    apptainer += ["--pwd", WORKDIR] if options.workdir else []
    ranks, wait = request.nodes * request.tasks_per_node, RENDEZVOUS_WAIT_SECONDS
    late = (
        f"error: Horovod's rendezvous server did not start on $(hostname) (waited up to {wait} s): run apptainer "
        "exec $sif python -c 'import horovod' there to see why"
    )
    return [
        "# The ranks meet at Horovod's rendezvous server on this node, the allocation's first, with a secret of this",
        "# run: in the environment alone, never on a command line.",
        "HOROVOD_STACK_RENDEZVOUS_TOKEN=$(head -c 32 /dev/urandom | base64 | tr -d '/+=\\n')",
        "export APPTAINERENV_HOROVOD_STACK_RENDEZVOUS_TOKEN=$HOROVOD_STACK_RENDEZVOUS_TOKEN",
        f"address={rendezvous_address(request)}",
        '[ -n "$address" ] || { echo "error: no address for the rendezvous server on $(hostname)" >&2; exit 1; }',
        f"rendezvous_server={shlex.quote(RENDEZVOUS_SERVER)}",
        "port_file=$(mktemp)",
        f"hosts=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | sed 's/$/:{request.tasks_per_node}/' | paste -sd,)",
        "APPTAINERENV_RENDEZVOUS_ADDRESS=$address APPTAINERENV_RENDEZVOUS_HOSTS=$hosts \\",
        f"APPTAINERENV_RENDEZVOUS_RANKS={ranks} \\",
        '  apptainer exec --cleanenv "$sif" python -u -c "$rendezvous_server" >"$port_file" &',
        "rendezvous=$!",
        """trap 'kill "$rendezvous" 2>/dev/null || true; rm -f "$port_file"' EXIT""",
        f"for _ in $(seq {wait * 2}); do  # until it tells its port, or ends without",
        '  if [ -s "$port_file" ] || ! kill -0 "$rendezvous" 2>/dev/null; then break; fi',
        "  sleep 0.5",
        "done",
        f'[ -s "$port_file" ] || {{ echo "{late}" >&2; exit 1; }}',
        "export APPTAINERENV_HOROVOD_GLOO_RENDEZVOUS_ADDR=$address",
        'export APPTAINERENV_HOROVOD_GLOO_RENDEZVOUS_PORT=$(cat "$port_file")',
        "export APPTAINERENV_HOROVOD_CONTROLLER=gloo APPTAINERENV_HOROVOD_CPU_OPERATIONS=gloo",
        f"task_env={shlex.quote(TASK_ENV)}",
        "srun --mpi=none --kill-on-bad-exit=1 --cpu-bind=none --label \\",
        '  bash -c "$task_env" task \\',
        f"  {' '.join(apptainer)} \\",
        '  "$sif" \\',
        f"  {' '.join(command)}",
    ]


def stall_lines(request: SbatchRequest) -> list[str]:
    """With --stall-timeout N: stall_watch, the shell function that watches the ranks' srun (its process id, $1)
    from beside it. launcher/agent/batch_stall.py's `wait` (in the SIF, its stdout the job's output) returns once the
    job's output and its metrics file have not changed for N s (launcher/core/stall.py's rule); then one task per node
    (srun --overlap: in the job's own allocation) runs stacks.py's `collect` on that node's ranks (STACKS_TASK), and
    `report` prints every rank's stack, grouped as `launcher stacks` groups them. With the stall action warn, the next
    stall is reported after the job shows progress again; with fail, the ranks' srun is ended (the job FAILED)."""
    options = request.job
    if options.stall_timeout <= 0:
        return []
    timeout, fail = options.stall_timeout, options.stall_action == "fail"
    metrics = run_paths(options.command, run_folder(request), options.can_restart).metrics_file
    in_sif = ["apptainer", "exec", "--cleanenv", *bind_words(request), '"$sif"', "python", "-m", BATCH_STALL]
    wait = [*in_sif, "wait", '--ranks "$1"', f"--timeout {timeout}"]
    wait += [f"--metrics {shell_word(metrics)}"] if metrics else []
    report = [
        "apptainer",
        "exec",
        "--cleanenv",
        '"$sif"',
        "python",
        "-m",
        BATCH_STALL,
        "report",
        f"--timeout {timeout}",
    ]
    report += ["--fail"] if fail else []
    then = (
        ['    kill "$1" 2>/dev/null || true  # the ranks end: the job FAILED', "    return 0"]
        if fail
        else ["    after=$(date +%s.%N)  # the next stall, after the job shows progress again"]
    )
    return [
        f"# --stall-timeout {timeout}: when the job's output and its metrics file have not changed for {timeout} s,",
        "# every rank's stack goes into the output, once per stall; "
        + ("--stall-action fail: the job ends." if fail else "the job goes on (--stall-action warn)."),
        f"stacks_task={shlex.quote(STACKS_TASK)}",
        "stall_watch() {  # $1: the ranks' srun",
        "  local after=0",
        f'  while {" ".join(wait)} --after "$after"; do',
        '    srun --overlap --mpi=none --cpu-bind=none --nodes="$SLURM_JOB_NUM_NODES" \\',
        '      --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 bash -c "$stacks_task" "$sif" \\',
        f"      | {' '.join(report)} || true",
        *then,
        "  done",
        "}",
    ]


def watched(start: list[str]) -> list[str]:
    """The ranks' srun (`start`'s last line) beside the stall watch: the script ends with the ranks' exit status once
    the watch has ended too (it notices the ranks' end)."""
    return [
        *start[:-1],
        start[-1] + " &",
        "ranks=$!",
        'stall_watch "$ranks" &',
        "watch=$!",
        "status=0",
        'wait "$ranks" || status=$?',
        'wait "$watch" || true',
        'exit "$status"',
    ]


def slurm_time(seconds: int) -> str:
    """Seconds as sbatch's --time writes them: DAYS-HOURS:MINUTES:SECONDS."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, rest = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{rest:02d}"


def directives(request: SbatchRequest) -> list[str]:
    """The #SBATCH lines: the allocation, the output file, the environment, and requeueing."""
    options = request.job
    wanted: list[tuple[str, object]] = [
        ("job-name", request.name),
        ("nodes", request.nodes),
        ("ntasks-per-node", request.tasks_per_node),
        ("gpus-per-node", request.gpus_per_node or None),
        ("partition", request.partition),
        ("account", request.account),
        ("time", slurm_time(options.time_limit) if options.time_limit else None),
        ("output", OUTPUT_FILE),
        ("export", "ALL"),
    ]
    wanted += [("requeue", ""), ("open-mode", "append")] if options.can_restart else [("no-requeue", "")]
    return [f"#SBATCH --{name}" + (f"={value}" if value != "" else "") for name, value in wanted if value is not None]


def secret_lines(request: SbatchRequest) -> list[str]:
    """Each secret's value from the script's environment (the one sbatch ran in) into every rank's, by name; the
    script stops, naming it, where one is missing."""
    names = request.job.secrets
    if not names:
        return []
    return [
        "# Secrets: each value comes from the environment sbatch ran in (--export=ALL); none is in this file.",
        f"for name in {' '.join(names)}; do",
        '  if [ -z "${!name:-}" ]; then',
        '    echo "error: secret $name is not set: export $name in the shell that runs sbatch, then submit again" >&2',
        "    exit 2",
        "  fi",
        '  export "APPTAINERENV_$name=${!name}"',
        "done",
    ]


def restart_lines(request: SbatchRequest) -> list[str]:
    """With --max-restarts N: stop past N requeues; after one, say so (and give the bundled trainer --resume). The
    ranks' Gloo timeout outlasts the site's SlurmdTimeout (twice it, plus a minute: Slurm's pings run every third of
    it), so a lost node ends the job by Slurm's hand, which requeues it, not by a rank's timeout, which fails it."""
    options = request.job
    if not options.can_restart:
        return []
    count, most = '"${SLURM_RESTART_COUNT:-0}"', options.max_restarts
    lines = [
        f"# --max-restarts {most}: Slurm requeues the job when it loses a node; each run resumes from the newest",
        "# checkpoint in the run folder.",
        f"if [ {count} -gt {most} ]; then",
        f'  echo "error: Slurm requeued the job $SLURM_RESTART_COUNT times, past --max-restarts {most}:" \\',
        '    "not run again" >&2',
        "  exit 1",
        "fi",
        "# Slurm requeues only a job still running when it declares a node lost (SlurmdTimeout after the node's last",
        "# answer): until then the ranks wait on the silent peer, rather than fail at Gloo's 30 s and end the job.",
        "slurmd_timeout=$(scontrol show config 2>/dev/null | awk '$1 == \"SlurmdTimeout\" {print $3}') || true",
        f'case "$slurmd_timeout" in "" | *[!0-9]*) slurmd_timeout={SLURMD_TIMEOUT_DEFAULT} ;; esac',
        "gloo_timeout=$((2 * slurmd_timeout + 60))",
    ]
    after = f'echo "restart $SLURM_RESTART_COUNT/{most}: resuming from the newest checkpoint"'
    if resumes(request):
        return [*lines, "resume=()", f"if [ {count} -gt 0 ]; then", "  resume=(--resume)", f"  {after}", "fi"]
    return [*lines, f"if [ {count} -gt 0 ]; then", f"  {after}", "fi"]


def output_folder(request: SbatchRequest) -> str | None:
    """The run folder in the containers: the bundled trainer's (its --run-dir, else the job's own), or for a command
    of the user's with a timeline, autotuning or restarts, the job's own for those; None: the command decides."""
    options = request.job
    paths = run_paths(options.command, run_folder(request), options.can_restart)
    wanted = options.timeline or options.autotune or options.can_restart
    return paths.run_dir or (run_folder(request) if wanted else None)


def folder_lines(request: SbatchRequest) -> list[str]:
    """The run folder made in the shared folder (as the job agent makes it elsewhere), and named in the output."""
    folder = output_folder(request)
    if folder is None:
        return []
    if not folder.startswith(SHARED_MOUNT + "/"):
        return [f"echo {shell_word('run folder (in the containers): ' + folder)}"]
    host = request.shared + folder[len(SHARED_MOUNT) :]
    return [f"run_folder={shell_word(host)}", 'mkdir -p "$run_folder"', 'echo "run folder: $run_folder"']


def script(request: SbatchRequest) -> str:
    """The batch script, for `sbatch FILE`."""
    env = [
        f"export APPTAINERENV_{name}={shell_word(value)}"
        for name, _, value in (pair.partition("=") for pair in rank_env(request))
    ]
    stall, start = stall_lines(request), rank_start(request, rank_words(request))
    lines = [
        "#!/bin/bash",
        f"# Job {request.name}, written by `launcher export sbatch`; submit it with `sbatch FILE`.",
        "# Every node needs: Apptainer, the SIF and the shared folder at these paths, and its host name resolving to"
        " its address.",
        *directives(request),
        "set -euo pipefail",
        f"sif={shlex.quote(request.sif)}",
        *secret_lines(request),
        *restart_lines(request),
        *folder_lines(request),
        "# Every rank's environment: Apptainer gives a rank APPTAINERENV_NAME as NAME, past --cleanenv.",
        *env,
        *stall,
        *(watched(start) if stall else start),
    ]
    return "\n".join(lines) + "\n"
