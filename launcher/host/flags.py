"""What the launcher's flags mean: each one's help text, and what `start`'s and `export mpijob`'s flags turn into
(the keyword arguments of settings.resolve_settings and mpijob_request.request, job options by their JobOptions names).
Pure: the command line (launcher/cli.py) declares the flags with these texts and hands over what it was given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from launcher.core.nics import NIC_SETTING
from launcher.core.protocol import LINK_SECONDS

NODES = (
    "Comma-separated hosts, rank 0 first, each HOST or HOST:SLOTS (its ranks) as horovodrun's -H (default: NODES in "
    ".env)."
)
HOSTFILE = "Open MPI hostfile listing the nodes instead of --nodes: one `HOST slots=N` line each, rank 0 first."
NIC = (
    "The nodes' NIC for Open MPI, NCCL and Gloo: a name every node has (eth0), or a subnet (10.0.0.0/24) where "
    f"the names differ: each node uses its NIC in it (default: {NIC_SETTING} in .env; none: virtual NICs left out)."
)
ENV_FILE = "Settings file (default: ./.env if present)."
GPUS = (
    "GPUs per node, one rank each (NVIDIA Container Toolkit): a count, or GPU IDs such as 0,1 (device=1 for one "
    "GPU by ID); default: GPUS_PER_NODE in .env."
)
SLOTS = "Ranks per node on CPUs (default 1); with --gpus, one rank per GPU: leave it out or give the same count."
INSECURE = (
    "Allow engines off this machine that others could read: plain tcp://, or TLS without DOCKER_TLS_VERIFY (or "
    "INSECURE_ENGINES=1 in .env); the cluster's private key, job settings, registry credentials and the workdir "
    "then cross the network unencrypted, with a warning. Without it such an engine is refused; use TLS "
    "(DOCKER_TLS_VERIFY, DOCKER_CERT_PATH; per node DOCKER_TLS_VERIFY_<NODE>, DOCKER_CERT_PATH_<NODE>)."
)

START = {
    "image": "Image to run (default horovod-stack:latest).",
    "ssh_port": "Port of the workers' sshd (default 12345).",
    "push_image": "Copy the image from this machine's engine to nodes that lack it (only the layers they lack).",
    "detach": "Return once training runs; follow with `launcher logs --follow`; every container stops when the job "
    "ends.",
    "keep_running": "With --detach: keep the containers running after the job ends, for debugging (`launcher stop` "
    "removes them).",
    "workdir": "Local folder with your code, copied to /workdir on every node; the command runs there.",
    "env": "KEY=VALUE for every rank (repeatable).",
    "secret": "NAME of a secret setting (an API key, a token) every rank gets, its value taken from this machine's "
    "environment or .env and never shown: not on a command line, in a log or in the plan (repeatable; default: "
    "SECRETS in .env).",
    "elastic": "Elastic training (horovodrun, Gloo): a node whose worker is lost is dropped and the job goes on; "
    "needs --network-interface.",
    "min_nodes": "With --elastic: the fewest nodes the job goes on with (default 1). With --max-restarts: the fewest "
    "nodes a restart may run on (default: all; a lost node's worker is waited for).",
    "spares": "Comma-separated hosts kept in reserve, HOST or HOST:SLOTS: each gets a worker, started and checked as "
    "the nodes' are, out of the hostfile until a restart (--max-restarts) puts it in a lost node's place; `launcher "
    "status` lists them as role=spare (default: SPARES in .env).",
    "max_restarts": "A fixed-size job that loses a node is started again this many times at most by its agent, "
    "resuming from the newest checkpoint in the shared folder (the bundled trainer with --resume; a script of yours: "
    "HOROVOD_STACK_RESTART and HOROVOD_STACK_CHECKPOINT_DIR); a failure of the script itself, once at most "
    "(default: MAX_RESTARTS in .env, else 0: never).",
    "max_nodes": "With --elastic: the most nodes that train at once (default: all).",
    "restart_workers": "With --elastic: a worker container that fails (a crash, the kernel's out-of-memory kill) is "
    "started again by its node's Docker engine and rejoins at the next host discovery, attached or --detach.",
    "worker_restarts": "With --restart-workers: how often each node's engine starts its failed worker again at most "
    "(default: WORKER_RESTARTS in .env, else 5).",
    "device": "A host device for every worker, HOST[:CONTAINER] (repeatable; default: DEVICES in .env), e.g. "
    "/dev/infiniband so NCCL uses RDMA instead of sockets.",
    "debug": "NCCL_DEBUG=INFO for every rank: NCCL's topology and transports (default: WARN, errors only).",
    "mount": "A host folder for every worker, HOST_PATH:CONTAINER_PATH[:ro] (repeatable; default: MOUNTS in .env), "
    "e.g. a dataset at the same path on every node: /data/mnist:/data:ro.",
    "stall_timeout": "Seconds without output or new metrics before the job counts as stalled: every rank's stack goes "
    "into its log and `launcher status` says so (default: STALL_TIMEOUT in .env, else 300; 0: off).",
    "stall_action": "On a stall: warn (the job goes on) or fail (it ends with the stall as its error); default warn.",
    "time_limit": "Seconds the job may run: past them every rank's stack goes into its log and the job is ended, exit "
    "status 124, with the limit as its error (default: TIME_LIMIT in .env, else 0: no limit).",
    "no_ptrace": "Start the workers without SYS_PTRACE, for clusters that forbid it: no stacks (`launcher stacks`, a "
    "stall, the time limit) (default: PTRACE in .env, else with it).",
    "timeline": "Rank 0 writes Horovod's timeline into the run folder (timeline.json; `launcher results` brings it "
    "home; open it in https://ui.perfetto.dev or chrome://tracing). Default: TIMELINE in .env.",
    "autotune": "Horovod's autotuning of the fusion threshold, cycle time and more while the job trains; its log and "
    "what it chose go into the run folder (autotune.csv, autotune.json). Default: AUTOTUNE in .env.",
    "dry_run": "Run every check a start runs and print the plan (containers, hostfile, mpirun line); start nothing.",
    "ranks": "Show only these ranks' lines of the job's output here, e.g. 0 or 0,3 (the job agent's own lines too); "
    "the job's log keeps every rank's: `launcher logs --rank N` while the job runs, job.log in its run folder after "
    "(default: every line).",
}

READING_IMAGE = (
    "Image whose short-lived containers read the nodes' shared folder, which any of the stack's images can (default: "
    "IMAGE in .env, else horovod-stack:latest; horovod-stack:tensorflow where the nodes hold only that one)."
)
LOGS = {
    "node": "That node's worker's own output, then the job's lines of the ranks that ran there (after a restart on "
    "a spare, the spare's); default: rank 0's worker and the whole job.",
    "rank": "Only the lines rank N wrote, as their prefix says: mpirun's [1,N]<stdout>:, elastic horovodrun's "
    "[N]<stdout>: or the bundled trainer's [rank N] (the job agent's own lines and untagged ones are left out).",
    "grep": "Only the lines that hold this text (with --rank: of that rank).",
    "tee": "Also write every line into a file of its rank in this folder (rank-N.log; other.log for lines of no "
    "rank), whatever --rank and --grep show.",
}

DOCTOR = {
    "image": "Image to check (default horovod-stack:latest).",
    "ssh_port": "Port the workers' sshd will use.",
    "gpus": "Check for these GPUs too: " + GPUS,
    "links": "Also measure every pair of nodes' link both ways (rate and round trip, between host-network containers "
    "of the image, over the job's NIC, on the SSH port) and predict one ring allreduce and one parameter-server "
    "exchange on the slowest link, with one line of advice against the compute per step.",
    "gradient_mb": "With --links: the gradient to predict for, in MB (default: the bundled trainer's SimpleNet).",
    "link_seconds": f"With --links: the longest each direction of a pair streams (default {LINK_SECONDS:g} s).",
    "compute_ms": "With --links: the compute of one training step in ms, for the advice (default: the bundled "
    "trainer's, measured once on rank 0's node; needed with --gradient-mb).",
    "push_image": START["push_image"] + " Then every check runs on every node, --links too; a start needs no copy.",
}

EXPORT = {
    "kind": "What to write: mpijob (a Kubeflow MPIJob, kubeflow.org/v2beta1).",
    "name": "The MPIJob's name (a DNS-1035 label); pods are NAME-launcher, NAME-worker-I.",
    "workers": "Worker pods, one rank per slot each.",
    "slots": "Ranks per worker on CPUs (default 1); with GPUs, one rank per GPU: leave it out or give the same count.",
    "gpus_per_node": "GPUs per worker (nvidia.com/gpu), one rank each; 0: CPU ranks.",
    "image": "The image as the nodes pull it, REGISTRY/NAME:TAG or @DIGEST (default: IMAGE in .env); required.",
    "namespace": "The namespace (default: default).",
    "shared_claim": "PersistentVolumeClaim mounted at /shared in every pod (default horovod-stack-shared).",
    "env": "KEY=VALUE for every rank (repeatable).",
    "secret": "NAME=SECRET/KEY: every rank gets NAME from key KEY of the Kubernetes Secret SECRET (valueFrom."
    "secretKeyRef; the document holds no value; repeatable).",
    "cpu": "Each worker's CPU, REQUEST[:LIMIT] (default: 1 per rank, no limit).",
    "memory": "Each worker's memory, REQUEST[:LIMIT] (default: 2Gi per rank, no limit); /dev/shm counts in it.",
    "pod_security": "The Pod Security profile the pods pass: baseline (default), restricted or privileged.",
    "ptrace": "Workers get SYS_PTRACE for `launcher stacks` (needs privileged).",
    "rdma": "Workers get IPC_LOCK for RDMA's locked memory (needs privileged).",
    "run_as_user": "The pods' user id (default 1000, the image's user), or `platform` to leave it to the platform.",
    "schedule_timeout": "Seconds the job waits for all its workers to start before it fails (default: no limit).",
    "deadline": "Seconds the whole job may take, the wait included (runPolicy.activeDeadlineSeconds).",
    "scheduler": "volcano or scheduler-plugins (gang scheduling: runPolicy.schedulingPolicy), or kueue.",
    "queue": "The Volcano Queue or Kueue LocalQueue (with --scheduler).",
    "priority_class": "The pods' PriorityClass (and the PodGroup's).",
    "suspend": "Create the MPIJob suspended (runPolicy.suspend), to resume later.",
    "elastic": "Refused: elastic MPIJobs are not supported (docs/kubernetes.md).",
    "min_workers": "Refused, with --elastic.",
    "network_interface": "The pods' NIC for Open MPI, NCCL and Gloo (default: none; virtual NICs left out).",
    "output": "Write the document here (default: stdout).",
}

NCCL_DEBUG = "NCCL_DEBUG=INFO"
"""--debug: what every rank is given."""


@dataclass(frozen=True)
class StartFlags:
    """`launcher start`'s own flags as given (None or False where not given: .env or the default decides), typed from
    the command line to the settings; the nodes, the hostfile and the engines' flags are NodeFlags."""

    slots: int | None = None
    gpus: str | None = None
    image: str | None = None
    ssh_port: int | None = None
    network_interface: str | None = None
    push_image: bool = False
    detach: bool = False
    keep_running: bool = False
    workdir: Path | None = None
    env: tuple[str, ...] = ()
    secret: tuple[str, ...] = ()
    elastic: bool = False
    min_nodes: int | None = None
    max_nodes: int | None = None
    restart_workers: bool = False
    worker_restarts: int | None = None
    max_restarts: int | None = None
    spares: str | None = None
    device: tuple[str, ...] = ()
    debug: bool = False
    mount: tuple[str, ...] = ()
    stall_timeout: int | None = None
    stall_action: str | None = None
    time_limit: int | None = None
    no_ptrace: bool = False
    timeline: bool = False
    autotune: bool = False
    ranks: str | None = None


def start_settings(given: StartFlags, command: tuple[str, ...]) -> dict[str, Any]:
    """resolve_settings's keyword arguments (less the nodes, the hostfile and the engines' own) from `launcher
    start`'s flags; None where a flag was not given (.env or the default decides)."""
    return {
        "spares": given.spares,
        "slots": given.slots,
        "gpus": given.gpus,
        "image": given.image,
        "devices": given.device,
        "push_image": given.push_image,
        "detach": given.detach,
        "keep_running": given.keep_running,
        "ranks": given.ranks,
        "job": {
            "network_interface": given.network_interface,
            "ssh_port": given.ssh_port,
            "stall_timeout": given.stall_timeout,
            "stall_action": given.stall_action,
            "time_limit": given.time_limit,
            "elastic": given.elastic,
            "max_restarts": given.max_restarts,
            "command": command,
            "env": (*given.env, *([NCCL_DEBUG] if given.debug else [])),
            "secrets": given.secret,
            "elastic_min_workers": given.min_nodes,
            "elastic_max_workers": given.max_nodes,
            "restart_workers": given.restart_workers,
            "worker_restarts": given.worker_restarts,
            "workdir": str(given.workdir) if given.workdir else None,
            "mounts": given.mount,
            "ptrace": False if given.no_ptrace else None,
            "timeline": given.timeline or None,
            "autotune": given.autotune or None,
        },
    }


EXPORT_JOB = {
    "env": "env",
    "elastic": "elastic",
    "min_workers": "elastic_min_workers",
    "network_interface": "network_interface",
    "schedule_timeout": "ready_timeout",
    "ptrace": "ptrace",
}
"""export mpijob's flags that set a job option, and the JobOptions field each sets."""
EXPORT_NOT_WHERE = ("image", "secret", *EXPORT_JOB)
"""export mpijob's flags that are not an MpiJobRequest field of their own name: the job's, and those export_request
words itself. Every other flag sets the field of its name, as given."""


@dataclass(frozen=True)
class ExportFlags:
    """`launcher export mpijob`'s flags that make the document, as given, typed from the command line to the
    request (mpijob_request.request's keywords)."""

    name: str
    workers: int
    slots: int | None = None
    gpus_per_node: int = 0
    image: str | None = None
    namespace: str | None = None
    shared_claim: str | None = None
    env: tuple[str, ...] = ()
    secret: tuple[str, ...] = ()
    cpu: str | None = None
    memory: str | None = None
    pod_security: str | None = None
    ptrace: bool = False
    rdma: bool = False
    run_as_user: str | None = None
    schedule_timeout: int | None = None
    deadline: int | None = None
    scheduler: str | None = None
    queue: str | None = None
    priority_class: str | None = None
    suspend: bool = False
    elastic: bool = False
    min_workers: int | None = None
    network_interface: str | None = None


def export_request(given: ExportFlags, command: tuple[str, ...], env_image: Callable[[], str | None]) -> dict[str, Any]:
    """mpijob_request.request's keyword arguments from `launcher export mpijob`'s flags; `env_image` reads IMAGE in
    .env, for want of --image (the .env file is read only then)."""
    flags = {field.name: getattr(given, field.name) for field in fields(given)}
    job = {option: flags[flag] for flag, option in EXPORT_JOB.items()}
    return {
        **{name: value for name, value in flags.items() if name not in EXPORT_NOT_WHERE},
        "job": {**job, "command": command, "env": given.env},
        "image": given.image or env_image(),
        "secret_refs": given.secret,
    }
