"""What the stack's processes agree on: paths in the containers, shared defaults, the agent's and the workers' words
(the job's end itself is a record: launcher/core/jobend.py).

One home for each fact that more than one process reads: the host-side launcher, the job agent in the rank-0 (or
compose launcher) container, each worker's entrypoint (docker/entrypoint.sh reads the values it needs through
`python -m launcher.core.protocol shell`) and `launcher status`. Nothing here has side effects.

    python -m launcher.core.protocol shell               KEY=VALUE lines for bash (eval)
"""

from __future__ import annotations

import shlex
import signal
import sys

from app import frameworks

# --- defaults every launch method shares ------------------------------------------------------------------------
SSH_PORT = 12345
"""The workers' sshd port (SSH_PORT, --ssh-port)."""
READY_TIMEOUT_SECONDS = 180
"""How long the agent waits for every worker's sshd to answer (READY_TIMEOUT)."""
ELASTIC_TIMEOUT_SECONDS = 60
"""How long an elastic job waits below its minimum for workers to come back (ELASTIC_TIMEOUT) before it fails."""
SSH_CONNECT_TIMEOUT_SECONDS = 10
"""ssh's ConnectTimeout for every connection the agent and mpirun make inside the cluster."""
KEEPALIVE_INTERVAL_SECONDS = 5
KEEPALIVE_COUNT = 3
SILENCE_SECONDS = KEEPALIVE_INTERVAL_SECONDS * KEEPALIVE_COUNT
"""A peer that answers nothing this long is gone (a pulled cable, a failed switch port, a kernel panic or a power
loss send no TCP reset): every ssh into the cluster gives up on it then (ServerAlive*, launcher.core.jobspec.ssh_config:
the agent's to its workers, mpirun's and horovodrun's sessions), and so does each worker's sshd (docker/sshd_config's
ClientAlive*, which must agree)."""
WORKER_STOP_GRACE_SECONDS = 2
"""A worker told that the job ended waits this long before it stops, so the job's driver exits first (compose's
`up --exit-code-from launcher` then reports the job's status, not a worker's)."""
WORKER_CLAIM_TIMEOUT_SECONDS = 900
"""A worker that no job's agent has claimed (no agent connected) this long after it started stops by itself: nothing is
left running when the client that started it died before the job began. Not an MPIJob's workers (role
mpijob-worker): they wait while the job may be scheduled, and the MPI Operator removes them when the job ends.
WORKER_CLAIM_TIMEOUT in a worker's environment overrides it (0: never)."""

DEFAULT_IMAGE = frameworks.PYTORCH.image
"""The image every launch method runs unless told otherwise (IMAGE, --image): PyTorch's; TensorFlow's is
frameworks.TENSORFLOW.image."""
SHARED_VOLUME = "horovod-stack-shared"
"""The shared folder's default: a Docker volume of this name on each node, compose's volume, the MPIJob's claim."""
SHM_SIZE = "1g"
"""Shared memory for every worker (NCCL and Gloo use it), as Docker writes sizes."""
MPIUSER_UID = 1000
"""The image's user, who runs sshd and every rank, and owns what the stack writes into containers."""

# --- the worker container, as every launch method starts it ---------------------------------------------------------
WORKER_ULIMITS = {"stack": 64 * 1024**2}
"""NCCL's container advice, for every worker: a 64 MB stack (compose.yaml sets the same)."""
GPU_WORKER_ULIMITS = {**WORKER_ULIMITS, "memlock": -1}
"""GPU workers also get unlimited locked memory, which NCCL's RDMA transports register their buffers in
(compose.gpu.yaml sets the same). Not for CPU workers: raising the limit needs the engine's CAP_SYS_RESOURCE,
which some hosts (sandboxes, rootless engines) lack, and CPU jobs have no use for it."""
WORKER_USER = str(MPIUSER_UID)
"""Who every worker runs as, given to Docker (user=, compose's user:), whatever USER an image derived from ours ends
with: sshd and every rank as the image's user (its groups from the image), never root. (A uid alone: the engine
looks a "uid:gid" up as a name where Compose copies a secret in, and fails.)"""
WORKER_CAPABILITIES = ("IPC_LOCK",)
"""The capabilities a worker gets back after dropping every one (cap_drop ALL): IPC_LOCK lets a rank lock the memory
it registers for RDMA (InfiniBand, RoCE)."""
PTRACE_CAPABILITY = "SYS_PTRACE"
"""Added unless a job is started with --no-ptrace: py-spy reads the ranks' stacks with it (`launcher stacks`, the stall
watch, the time limit). Without it a worker also gets no-new-privileges (no file capability or setuid bit works)."""

# --- paths inside the containers ----------------------------------------------------------------------------------
HOME = "/home/mpiuser"
SHARED_MOUNT = "/shared"
RUNS_DIR = f"{SHARED_MOUNT}/runs"
"""Each run of the bundled trainer writes into a folder of its own here: metrics, checkpoints, TensorBoard."""
WORKDIR = "/workdir"
"""Where the user's code sits in every container (--workdir, compose's WORKDIR); the job's working directory."""
CLUSTER_SSH_DIR = "/cluster/ssh"
"""The cluster's public key, as the workers' sshd reads it (authorized_keys; compose: a volume the workers mount
read-only)."""
CLUSTER_PRIVATE_DIR = "/cluster/private"
"""What rank 0's container (compose: the launcher's) alone holds, in its own file system, never on a volume or in
another container: the cluster's private key and the job's secret settings."""
CLUSTER_KEY = f"{CLUSTER_PRIVATE_DIR}/id_ed25519"
SECRETS_FILE = f"{CLUSTER_PRIVATE_DIR}/secrets.json"
"""The job's secret settings in rank 0's container, {NAME: VALUE} as JSON, mode 0600, handed over as the private key
is; the agent reads it and removes it before the job runs."""
COMPOSE_SECRETS_DIR = "/run/secrets"
"""Where Compose puts a service's `secrets:`, a file per secret: in the launcher service, each file named like a
variable is a secret setting of the job (docs/multi-host.md, docs/compose.md)."""
SECRET_SHOWN = "***"
"""What stands for a secret's value wherever the stack shows one (NAME=***)."""
HOSTKEYS_DIR = "/cluster/hostkeys"
"""Each worker's public host key as ADDRESS.pub, which the agent pins (never trusted over the network)."""
SSH_DIR = f"{HOME}/.ssh"
SSH_CONFIG = f"{SSH_DIR}/config"
KNOWN_HOSTS = f"{SSH_DIR}/known_hosts"
HOSTFILE_PATH = f"{HOME}/hostfile"
JOB_SPEC = f"{HOME}/job.json"
"""The job the agent runs (launcher.core.jobspec.JobSpec as JSON): written by the multi-host launcher, or by the agent
itself from compose's environment; elastic host discovery reads it too."""
JOB_PRIVATE_FILES = (CLUSTER_KEY, SECRETS_FILE, JOB_SPEC)
"""What rank 0's container holds for the job alone, removed when the job winds down: the cluster's private key,
the secrets (already gone once the agent read them) and the job's spec."""
JOB_LOG = f"{HOME}/job.log"
"""The agent's and the job's output, in the multi-host launcher's rank-0 container (`launcher logs`, `status`)."""
KEPT_JOB_LOG = "job.log"
"""In the job's run folder: JOB_LOG as it was when the job ended (every rank's lines, tagged), kept after the
containers are gone (`launcher results` brings it home)."""
JOB_STATUS = f"{HOME}/job.status"
"""How the job ended (launcher.core.jobend.JobEnd as JSON), written once it has ended, however it ended."""
JOB_END_FILE = f"{HOME}/.job-ended"
"""In every worker: the job's end record its agent sent (launcher.core.jobend.JobEnd); the entrypoint stops the
worker when it appears."""
WORKER_CLAIMED = f"{HOME}/.claimed"
"""In every worker: made when an agent's ssh connection first reaches it."""
AGENT = ("python", "-m", "launcher.agent")
AGENT_LINK = "agent-link"
"""The agent's subcommand a worker runs at the far end of the agent's ssh connection to it: it holds the
connection open and records how the job ended (`python -m launcher.agent agent-link --driver D`)."""
STACKS = ("python", "-m", "launcher.agent.stacks")
"""In a worker container: its ranks' stacks, as JSON (`STACKS collect --node NAME [--native]`)."""
JOB_LOST = f"{HOME}/job.lost"
"""In the agent's container while an elastic job runs: the addresses of the workers it lost (their ssh connection
closed, or silent), one a line. Host discovery leaves them out until the agent claims a new worker there."""
JOB_STALL = f"{HOME}/job.stall"
"""In the agent's container while the job runs: the stall watch's record (launcher/core/stall.py), for `status`."""
JOB_RESTARTS = f"{HOME}/job.restarts"
"""In the agent's container once the job was restarted: one JSON record per restart (launcher/core/restart.py's
Restart.record), for `status` while the job runs."""
STALL_TIMEOUT_SECONDS = 300
"""A running job that prints nothing and records no new metrics this long is stalled (0: no stall watch)."""
RESTART_VARIABLE = "HOROVOD_STACK_RESTART"
"""In every rank's environment when a job may be restarted (--max-restarts, MAX_RESTARTS): 0 in its first run, N in
its Nth restart (docs/trainer.md)."""
CHECKPOINT_DIR_VARIABLE = "HOROVOD_STACK_CHECKPOINT_DIR"
"""In every rank's environment when a job may be restarted: the folder in the shared folder where the job keeps its
checkpoints and a restart resumes from (the bundled trainer's --checkpoint-dir; a script of the user's writes its
own there)."""
RANK_NIC = ("python", "-m", "launcher.agent.rank_nic")
"""In front of each rank's command when the job's NIC is a subnet: sets NCCL's and Gloo's NIC to the rank's own."""
DISCOVERY_SCRIPT = "/opt/horovod-stack/docker/discover-hosts.sh"
"""Elastic Horovod's host discovery, in the image (`python -m launcher.agent discover`)."""

LINK_PROBE = ("python", "-m", "launcher.agent.linkprobe")
"""`launcher doctor --links`' two ends, each in a short-lived host-network container of the image."""
STEP_TIME_PROBE = ("python", "-m", "app.step_time")
"""`launcher doctor --links`' measure of the bundled trainer's compute per step, in a short-lived container of the
image on rank 0's node."""
LINK_SECONDS = 2.0
"""How long each direction of a node pair streams in the link test, unless --link-seconds says otherwise."""

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Ctrl-C, `kill` or a service manager's stop, a closed terminal: what the launcher and the agent stop on."""


class Signalled(BaseException):
    """A process was told to stop by one of STOP_SIGNALS; like KeyboardInterrupt, not an Exception."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# --- messages -----------------------------------------------------------------------------------------------------
AGENT_PREFIX = "[agent "
"""Every line the agent itself prints starts so ("[agent 12:00:01] ..."): the launcher tells them from the job's."""


def agent_line(stamp: str, message: str) -> str:
    """One line the agent prints: AGENT_PREFIX, when (HH:MM:SS, or - when it cannot say), the message."""
    return f"{AGENT_PREFIX}{stamp}] {message}"


def agent_message(line: str) -> str | None:
    """The message of one of the agent's lines (agent_line's), without its line break; None for any other line."""
    if not line.startswith(AGENT_PREFIX) or "] " not in line:
        return None
    return line.split("] ", 1)[1].rstrip("\n")


LOST_PREFIX = "lost: "
"""How a worker's end file starts when the job's driver went away instead of ending the job."""
KEEP_RUNNING = "keep running"
"""Sent to a worker by its agent instead of the job's end record: the job ended, but the worker stays
(--keep-running)."""


def lost_driver_message(driver: str) -> str:
    """What a worker records when its agent went away without the job's end record."""
    return f"{LOST_PREFIX}{driver} went away (its ssh connection closed)"


def shell_settings() -> dict[str, str]:
    """The values docker/entrypoint.sh needs, by their bash names."""
    return {
        "DEFAULT_SSH_PORT": str(SSH_PORT),
        "JOB_END_FILE": JOB_END_FILE,
        "WORKER_CLAIMED": WORKER_CLAIMED,
        "HOSTKEYS_DIR": HOSTKEYS_DIR,
        "WORKER_STOP_GRACE": str(WORKER_STOP_GRACE_SECONDS),
        "LOST_PREFIX": LOST_PREFIX,
        "DEFAULT_CLAIM_TIMEOUT": str(WORKER_CLAIM_TIMEOUT_SECONDS),
    }


# --- the MPIJob export (launcher/k8s/mpijob.py writes these paths into the document; agent/mpijob_pod.py reads them) --
MPIJOB_SSH_AUTH_DIR = "/cluster/mpi-operator-ssh"
"""The MPIJob's sshAuthMountPath: where the MPI Operator mounts its Secret (id_rsa, id_rsa.pub, authorized_keys;
root-owned, mode 0644) in the launcher and every worker. The entrypoint and the agent copy from there to the
places the stack's sshd and ssh read keys, owned by mpiuser with the modes they insist on."""
MPIJOB_HOSTFILE = "/etc/mpi/hostfile"
"""The operator's hostfile in the launcher pod: `<job>-worker-<i>.<job>.<ns>.svc slots=<slotsPerWorker>` lines."""
MPIJOB_DISCOVERY = "/etc/mpi/discover_hosts.sh"
"""The operator's elastic host discovery in the launcher pod: one host name per running worker, no slot counts
(horovodrun's --slots-per-host gives them)."""


def main(argv: list[str]) -> int:
    if argv == ["shell"]:
        print("\n".join(f"{key}={shlex.quote(value)}" for key, value in shell_settings().items()))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
