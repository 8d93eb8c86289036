"""What `launcher export`'s flags mean, each kind's declared once as rows of flags.Flag (from which launcher/cli.py
makes the typer parameters and their --help, as for `start`): the rows every kind shares with `start` (the job's
--env, the settings file), then each kind's own: MPIJOB (a Kubeflow MPIJob) and SBATCH (a Slurm batch script). A row's
`to` says where its value goes: JOB + a JobOptions field, or the request's field of that name (mpijob_request.request's
or sbatch_request.request's keywords, made here by `keywords`). Adding an export flag is one row here plus its use.
Pure: no typer, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from launcher.host.planning.flags import ENV_FILE, JOB, NCCL_DEBUG, ROWS, Flag

SHARED = (ROWS["env"], ENV_FILE)
"""The rows every kind takes as `start` does: --env (KEY=VALUE for every rank) and the settings file."""


def output_row(what: str) -> Flag:
    """--output/-o: where the kind's text goes."""
    return Flag("output", Path, f"Write the {what} here (default: stdout).", spellings=("--output", "-o"))


MPIJOB: tuple[Flag, ...] = (
    Flag("name", str, "The MPIJob's name (a DNS-1035 label); pods are NAME-launcher, NAME-worker-I.", required=True),
    Flag("workers", int, "Worker pods, one rank per slot each.", required=True),
    Flag(
        "slots",
        int,
        "Ranks per worker on CPUs (default 1); with GPUs, one rank per GPU: leave it out or give the same count.",
    ),
    Flag("gpus_per_node", int, "GPUs per worker (nvidia.com/gpu), one rank each; 0: CPU ranks."),
    Flag(
        "image", str, "The image as the nodes pull it, REGISTRY/NAME:TAG or @DIGEST (default: IMAGE in .env); required."
    ),
    Flag("namespace", str, "The namespace (default: default)."),
    Flag("shared_claim", str, "PersistentVolumeClaim mounted at /shared in every pod (default horovod-stack-shared)."),
    ROWS["env"],
    Flag(
        "secret",
        tuple,
        "NAME=SECRET/KEY: every rank gets NAME from key KEY of the Kubernetes Secret SECRET (valueFrom."
        "secretKeyRef; the document holds no value; repeatable).",
        to="secret_refs",
    ),
    Flag("cpu", str, "Each worker's CPU, REQUEST[:LIMIT] (default: 1 per rank, no limit)."),
    Flag(
        "memory", str, "Each worker's memory, REQUEST[:LIMIT] (default: 2Gi per rank, no limit); /dev/shm counts in it."
    ),
    Flag("pod_security", str, "The Pod Security profile the pods pass: baseline (default), restricted or privileged."),
    Flag("ptrace", bool, "Workers get SYS_PTRACE for `launcher stacks` (needs privileged).", to=JOB + "ptrace"),
    Flag("rdma", bool, "Workers get IPC_LOCK for RDMA's locked memory (needs privileged)."),
    Flag(
        "run_as_user",
        str,
        "The pods' user id (default 1000, the image's user), or `platform` to leave it to the platform.",
    ),
    Flag(
        "schedule_timeout",
        int,
        "Seconds the job waits for all its workers to start before it fails (default: no limit).",
        to=JOB + "ready_timeout",
    ),
    Flag("deadline", int, "Seconds the whole job may take, the wait included (runPolicy.activeDeadlineSeconds)."),
    Flag("scheduler", str, "volcano or scheduler-plugins (gang scheduling: runPolicy.schedulingPolicy), or kueue."),
    Flag("queue", str, "The Volcano Queue or Kueue LocalQueue (with --scheduler)."),
    Flag("priority_class", str, "The pods' PriorityClass (and the PodGroup's)."),
    Flag("suspend", bool, "Create the MPIJob suspended (runPolicy.suspend), to resume later."),
    Flag("elastic", bool, "Refused: elastic MPIJobs are not supported (docs/kubernetes.md).", to=JOB + "elastic"),
    Flag("min_workers", int, "Refused, with --elastic.", to=JOB + "elastic_min_workers"),
    Flag(
        "network_interface",
        str,
        "The pods' NIC for Open MPI, NCCL and Gloo (default: none; virtual NICs left out).",
        to=JOB + "network_interface",
    ),
    ENV_FILE,
    output_row("document"),
)
"""`launcher export mpijob`'s flags, in --help's order."""


COMMANDS_OWN = ("env_file", "output", "debug")
"""Rows the command itself reads (where the settings are, where the text goes; --debug goes into the job's --env)."""


def keywords(rows: tuple[Flag, ...], given: Mapping[str, Any], command: tuple[str, ...]) -> dict[str, Any]:
    """The request's keyword arguments from a kind's flags as the command line gave them (by row name): the job
    options' under `job` (the command, the --env pairs, NCCL_DEBUG=INFO with --debug), every other row's as the
    request's field of its `to` (else its name); the settings file and the output are the command's own."""
    job: dict[str, Any] = {"command": command}
    where: dict[str, Any] = {}
    for row in rows:
        if row.name in COMMANDS_OWN:
            continue
        value = tuple(given.get(row.name) or ()) if row.kind is tuple else given.get(row.name)
        to = row.to or row.name
        if to.startswith(JOB):
            job[to[len(JOB) :]] = value
        else:
            where[to] = value
    job["env"] = (*job.get("env", ()), *([NCCL_DEBUG] if given.get("debug") else []))
    return {"job": job, **where}


SBATCH: tuple[Flag, ...] = (
    Flag("nodes", str, "Nodes in the job's allocation (#SBATCH --nodes), a count: Slurm picks them.", required=True),
    Flag(
        "slots",
        int,
        "Ranks per node on CPUs, one Slurm task each (default 1); with --gpus-per-node, one rank per GPU: leave it "
        "out or give the same count.",
    ),
    Flag(
        "gpus_per_node",
        int,
        "GPUs per node (#SBATCH --gpus-per-node), one rank each, reached in the containers through apptainer --nv; "
        "0: CPU ranks.",
        spellings=("--gpus-per-node", "--gpus"),
    ),
    Flag(
        "sif",
        str,
        "The image as a SIF file at the same path on every node (apptainer build FILE.sif docker-daemon://IMAGE, or "
        "scripts/build-sif.sh: docs/slurm.md); required.",
        "SIF",
    ),
    Flag(
        "shared",
        str,
        "A folder every node mounts at the same path, bound at /shared in every rank's container: the run folders "
        "(runs/NAME-JOBID: metrics, curves, checkpoints) go there; required.",
        "SLURM_SHARED_DIR",
    ),
    Flag(
        "name",
        str,
        "The job's name (#SBATCH --job-name), and its run folder's, with the job ID.",
        shown="horovod-stack",
    ),
    Flag("partition", str, "The partition to run in, as #SBATCH --partition.", shown="the cluster's default"),
    Flag("account", str, "The account the job is charged to, as #SBATCH --account.", shown="your default"),
    Flag(
        "time",
        str,
        "The time limit in Slurm's format, as #SBATCH --time: e.g. 90 (minutes), 2:00:00 or 1-12:00:00.",
        shown="the partition's",
    ),
    Flag(
        "time_limit",
        int,
        "The time limit in seconds, as `launcher start` takes it (written as #SBATCH --time).",
        to=JOB + "time_limit",
    ),
    ROWS["env"],
    Flag(
        "secret",
        tuple,
        "NAME of a secret setting (an API key, a token) every rank gets, its value taken from the environment sbatch "
        "runs in: the script holds no value, and stops, naming it, where it is not set (repeatable).",
        to=JOB + "secrets",
    ),
    Flag(
        "network_interface",
        str,
        "The nodes' NIC for NCCL and Gloo, where the rendezvous server listens too: a name every node has (eth0), or "
        "a subnet (10.0.0.0/24) where the names differ: each node uses its NIC in it.",
        shown="none: virtual NICs left out",
        to=JOB + "network_interface",
    ),
    Flag(
        "workdir",
        str,
        "A folder with your code at the same path on every node, bound at /workdir in every rank's container; the "
        "command runs there.",
        to=JOB + "workdir",
    ),
    replace(ROWS["mount"], key=None),
    Flag(
        "max_restarts",
        int,
        "Requeue the job when Slurm loses one of its nodes (#SBATCH --requeue), this many times at most, each run "
        "resuming from the newest checkpoint in its run folder (the bundled trainer with --resume; a script of yours: "
        "HOROVOD_STACK_RESTART and HOROVOD_STACK_CHECKPOINT_DIR).",
        shown="0: never",
        to=JOB + "max_restarts",
    ),
    replace(
        ROWS["stall_timeout"],
        help="Seconds without output or new metrics before the job counts as stalled: every rank's stack (py-spy, one "
        "task per node beside the ranks) goes into the job's output once.",
        key=None,
        shown="0: off",
    ),
    replace(ROWS["stall_action"], key=None),
    Flag(
        "timeline", bool, "Rank 0 writes Horovod's timeline into the run folder (timeline.json).", to=JOB + "timeline"
    ),
    Flag(
        "autotune",
        bool,
        "Horovod's autotuning while the job trains; its log and what it chose go into the run folder (autotune.csv, "
        "autotune.json).",
        to=JOB + "autotune",
    ),
    ROWS["debug"],
    ENV_FILE,
    output_row("batch script"),
)
"""`launcher export sbatch`'s flags, in --help's order (start's rows it shares read no .env key here). `launcher
start`'s others mean nothing in a batch script: the command line takes them only to refuse them
(launcher/slurm/sbatch_request.py NOT_ON_SLURM)."""
SBATCH_FROM_ENV = tuple(row for row in SBATCH if row.key and not row.to)
"""export sbatch's rows that fall back on their .env key (SIF, SLURM_SHARED_DIR)."""
