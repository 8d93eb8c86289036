"""What `launcher export sbatch` was given, checked before anything is written: the SbatchRequest (the allocation, the
SIF, the shared folder, and the job's JobOptions every launch method builds), and every reason the script could not
run the job, one line each naming the fix (request raises them all). Which of `launcher start`'s flags mean nothing in
a Slurm batch script, and why (NOT_ON_SLURM): each is refused in one line rather than dropped without a word. The
script itself is launcher/slurm/sbatch.py's. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from launcher.core.options import JobOptions, SettingsError
from launcher.core.ranks import RankNames, ranks_per_node, ranks_problem

SBATCH_RANKS = RankNames("--slots {}", "--gpus-per-node {}", "--slots")
DEFAULT_NAME = "horovod-stack"
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A job name that is also a safe folder name (the run folder is NAME-JOBID)."""
SLURM_NAME = re.compile(r"[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*")
"""A partition (or a comma-separated list of them) or an account, as an #SBATCH line takes it."""
NO_STALL_WATCH = 0
"""A batch script watches for a stall only when --stall-timeout asks for it (`launcher start`'s watch is on by default):
the watch is one more process beside the job, and its py-spy must be allowed to read the ranks on the site's nodes."""
SIF_FIX = "apptainer build FILE.sif docker-daemon://horovod-stack:latest makes one (docs/slurm.md)"

ELASTIC = (
    "an elastic job needs horovodrun's host discovery, and a Slurm allocation does not grow or shrink under a "
    "running job: export a fixed-size job, with --max-restarts N to resume on a new allocation after a lost node"
)
NOT_ON_SLURM: dict[str, str] = {
    "--hostfile": "Slurm allocates the nodes: pass their count, --nodes N (sbatch's --nodelist picks them at submit)",
    "--image": f"Apptainer runs a SIF file, not an image: pass --sif FILE.sif ({SIF_FIX})",
    "--spares": "Slurm requeues the whole job on the nodes it allocates then: pass --max-restarts N",
    "--device": "an Apptainer container sees the node's devices (/dev/infiniband too) as they are",
    "--push-image": "no image is copied: the SIF is one file every node reads from the shared file system",
    "--insecure-engine": "no Docker engine is reached: sbatch submits the script to Slurm",
    "--ssh-port": "srun starts every rank as a Slurm task: no sshd, no ssh",
    "--elastic": ELASTIC,
    "--min-nodes": "Slurm requeues a job at the size it asked for (--nodes)",
    "--max-nodes": ELASTIC,
    "--elastic-timeout": ELASTIC,
    "--restart-workers": ELASTIC,
    "--worker-restarts": ELASTIC,
    "--no-ptrace": "Apptainer adds no capability to the ranks, so there is none to drop",
    "--detach": "a batch job runs detached: follow it with squeue and its output file",
    "--keep-running": "a batch job's allocation ends with the job",
    "--ranks": "the job's output file holds every rank's lines, each after its task number (srun --label): grep it",
    "--dry-run": "export starts nothing: read the script it writes",
}
"""`launcher start`'s flags that mean nothing in a batch script, by flag, and why: each is refused (refusal)."""


def refusal(flag: str) -> str:
    return f"{flag} has no meaning in a Slurm batch script: {NOT_ON_SLURM[flag]}; drop {flag}"


@dataclass(frozen=True)
class SbatchRequest:
    """What `launcher export sbatch` was given: the allocation, where the image and the shared folder are, the job."""

    job: JobOptions
    nodes: int
    sif: str
    """The SIF's absolute path, the same on every node."""
    shared: str
    """The shared folder's absolute path, the same on every node: bound at /shared for runs and checkpoints."""
    name: str = DEFAULT_NAME
    slots: int | None = None
    gpus_per_node: int = 0
    partition: str | None = None
    account: str | None = None

    @property
    def tasks_per_node(self) -> int:
        """A node's ranks, one Slurm task each: one per GPU, else the slots, else 1 (core/ranks.py)."""
        return ranks_per_node(self.slots, self.gpus_per_node, SBATCH_RANKS)


def slurm_seconds(text: str) -> int | None:
    """Seconds of a time as sbatch's --time takes it (MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS,
    DAYS-HOURS:MINUTES, DAYS-HOURS:MINUTES:SECONDS); None if `text` is none of those."""
    days, dash, clock = text.partition("-")
    if not dash:
        days, clock = "0", text
    parts = clock.split(":")
    if not days.isdigit() or len(parts) > 3 or not all(part.isdigit() for part in parts):
        return None
    numbers = [int(part) for part in parts]
    if dash:
        hours, minutes, seconds = (*numbers, 0, 0)[:3]
    else:
        hours, minutes, seconds = {1: (0, numbers[0], 0), 2: (0, *numbers), 3: tuple(numbers)}[len(numbers)]
    return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds


def path_problem(path: str | None, flag: str, missing: str) -> str | None:
    """Why `path` cannot be bound into every rank's container (Apptainer's --bind SRC:DEST splits at ':' and ',');
    `missing`: the line for no path at all. None if it can."""
    if not path:
        return missing
    if not PurePosixPath(path).is_absolute():
        return f"{flag} {path!r} is not an absolute path: pass the path every node has it at"
    if any(mark in path for mark in ":,\n"):
        return f"{flag} {path!r} holds ':', ',' or a line break, which Apptainer's --bind cannot take: rename it"
    return None


def nodes_count(text: str | None) -> tuple[int, str | None]:
    """The node count --nodes gives, or the line that refuses it."""
    if text is None:
        return 1, "no node count: pass --nodes N, the nodes the job's allocation holds"
    if not text.isdigit():
        return 1, f"--nodes {text!r}: Slurm picks an allocation's nodes, pass their count, e.g. --nodes 2"
    if int(text) < 1:
        return 1, f"--nodes {text}: a job needs at least 1 node; pass --nodes 1 or more"
    return int(text), None


def _where_problems(where: Mapping[str, Any]) -> list[str]:
    found = []
    name = where.get("name") or DEFAULT_NAME
    if not JOB_NAME.fullmatch(name):
        found.append(
            f"--name {name!r} is not a job name this script takes (letters, digits, '_', '.', '-', at most 64, "
            "starting with a letter or digit); pass such a --name"
        )
    for flag in ("partition", "account"):
        value = where.get(flag)
        if value is not None and not SLURM_NAME.fullmatch(value):
            found.append(f"--{flag} {value!r} is not a Slurm {flag} name; pass one `sinfo` or `sacctmgr` lists")
    sif = path_problem(where.get("sif"), "--sif", f"no SIF: pass --sif FILE.sif (or SIF in .env); {SIF_FIX}")
    shared = path_problem(
        where.get("shared"),
        "--shared",
        "no shared folder: pass --shared DIR (or SLURM_SHARED_DIR in .env), a folder every node mounts at one path",
    )
    found += [problem for problem in (sif, shared) if problem]
    ranks = ranks_problem(where.get("slots"), where.get("gpus_per_node") or 0, SBATCH_RANKS)
    return [*found, *([ranks] if ranks else [])]


def _time_limit(job: dict[str, Any], time: str | None) -> list[str]:
    """--time (Slurm's format) into the job's time_limit (seconds, --time-limit's); both given: refused."""
    if time is None:
        return []
    if job.get("time_limit") is not None:
        return ["--time and --time-limit both give the time limit: pass one of them"]
    seconds = slurm_seconds(time)
    if seconds is None:
        return [f"--time {time!r} is not a Slurm time: pass MINUTES, HOURS:MINUTES:SECONDS or DAYS-HOURS:MINUTES"]
    job["time_limit"] = seconds
    return []


def request(
    job: Mapping[str, Any], *, refused: tuple[str, ...] = (), time: str | None = None, **where: Any
) -> SbatchRequest:
    """The request `launcher export sbatch` makes of its flags: `job` the job options' (by JobOptions name; None: not
    given), `refused` the flags of NOT_ON_SLURM given, `time` --time in Slurm's format, `where` the SbatchRequest's own
    fields (nodes as given: a count). Raises SettingsError with every problem, one line each."""
    found = [refusal(flag) for flag in refused]
    chosen = {name: value for name, value in job.items() if value is not None}
    chosen.setdefault("stall_timeout", NO_STALL_WATCH)
    found += _time_limit(chosen, time)
    workdir = chosen.get("workdir")
    if workdir is not None:
        found += [problem for problem in [path_problem(workdir, "--workdir", "")] if problem]
    try:
        options = JobOptions(**chosen)
    except SettingsError as error:
        found += error.problems
        options = JobOptions()
    nodes, problem = nodes_count(where.pop("nodes", None))
    found += [problem] if problem else []
    found += _where_problems(where)
    if found:
        raise SettingsError(*found)
    given = {key: value for key, value in where.items() if value is not None}
    return SbatchRequest(job=options, nodes=nodes, **given)
