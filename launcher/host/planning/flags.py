"""What the launcher's flags mean: `launcher start`'s table of flags (FLAGS: each one's type, help, .env key and
default as --help words them, and where its value goes), from which the command line (launcher/cli.py) makes start's
parameters and this module the keyword arguments of settings.resolve_settings; and the help of the other commands'
flags (`launcher export`'s rows are launcher/host/planning/export_flags.py's). The job's own flags are rows made from
JobOptions' `option(flag=, key=, help=)` metadata (launcher/core/options.py): a new one is one edit there.
Pure: no typer, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from launcher.core.options import JobOptions, option_kind
from launcher.core.protocol import DEFAULT_IMAGE, LINK_SECONDS

NCCL_DEBUG = "NCCL_DEBUG=INFO"
"""--debug: what every rank is given."""
JOB = "job."
"""A row's `to` for a job option: `job.` and its JobOptions field."""


@dataclass(frozen=True)
class Flag:
    """One row of `launcher start`'s flags, from which its typer parameter, its --help and where its value goes are
    made."""

    name: str
    """The parameter's name, and the flag's (max_restarts: --max-restarts) unless `spellings` gives it."""
    kind: Any
    """What the command line gives: bool (a switch, False where not given), int, float, str or Path (None where not
    given), or tuple (a repeatable flag: list[str])."""
    help: str
    key: str | None = None
    """The .env key it overrides, as --help names it."""
    shown: str | None = None
    """What applies where neither the flag nor the key gives it, as --help words it (None: nothing to say)."""
    to: str | None = None
    """Where its value goes: a resolve_settings keyword, or JOB + a JobOptions field; None: the command's own
    (--dry-run, --env-file, --debug)."""
    spellings: tuple[str, ...] = ()
    """The flag's own spellings where not only --NAME (--gpus, --gpus-per-node; a switch without --no-NAME)."""
    required: bool = False
    """The command refuses to run without it (typer says so: `Missing option`)."""

    @property
    def text(self) -> str:
        """Its --help: the help, then its default (the .env key, else `shown`), made here for every row alike."""
        default = ", else ".join(part for part in (f"{self.key} in .env" if self.key else None, self.shown) if part)
        return f"{self.help.removesuffix('.')} (default: {default})." if default else self.help

    @property
    def flag(self) -> str:
        return self.spellings[0] if self.spellings else "--" + self.name.replace("_", "-")

    def value(self, given: Any) -> Any:
        """What the row hands on for the command line's `given`: a job option's switch only when given (None: .env or
        the default decides; --no-ptrace gives False), a repeatable flag's values as a tuple."""
        if self.kind is tuple:
            return tuple(given or ())
        if self.kind is bool and self.to and self.to.startswith(JOB):
            default = next(item.default for item in fields(JobOptions) if item.name == self.to[len(JOB) :])
            return (not default) if given else None
        if self.kind is Path and self.to and self.to.startswith(JOB):
            return str(given) if given else None
        return given


def job_flag(name: str) -> Flag:
    """The row of JobOptions field `name`, from its option() metadata."""
    item = next(item for item in fields(JobOptions) if item.name == name)
    meta, kind = item.metadata, option_kind(name)
    flag = meta["flag"]
    shown = meta.get("shown") or (None if item.default in (None, False, ()) else str(item.default))
    return Flag(
        flag.removeprefix("--").replace("-", "_"),
        Path if name == "workdir" else kind,
        meta["help"],
        meta["key"],
        shown,
        JOB + name,
        (flag,) if kind is bool and item.default else (),
    )


NODES = Flag(
    "nodes",
    str,
    "Comma-separated hosts, rank 0 first, each HOST or HOST:SLOTS (its ranks) as horovodrun's -H.",
    "NODES",
    to="nodes",
)
HOSTFILE = Flag(
    "hostfile",
    Path,
    "Open MPI hostfile listing the nodes instead of --nodes: one `HOST slots=N` line each, rank 0 first.",
    to="hostfile",
)
ENV_FILE = Flag("env_file", Path, "Settings file.", shown="./.env if present")
INSECURE = Flag(
    "insecure_engine",
    bool,
    "Allow engines off this machine that others could read: plain tcp://, or TLS without DOCKER_TLS_VERIFY; the "
    "cluster's private key, job settings, registry credentials and the workdir then cross the network unencrypted, "
    "with a warning. Without it such an engine is refused; use TLS (DOCKER_TLS_VERIFY, DOCKER_CERT_PATH; per node "
    "DOCKER_TLS_VERIFY_<NODE>, DOCKER_CERT_PATH_<NODE>).",
    "INSECURE_ENGINES",
    to="insecure_engines",
    spellings=("--insecure-engine",),
)
"""The flags every command that reaches the nodes takes."""
PUSH_IMAGE = "Copy the image from this machine's engine to nodes that lack it (only the layers they lack)."
GPUS = (
    "GPUs per node, one rank each (NVIDIA Container Toolkit): a count, or GPU IDs such as 0,1 (device=1 for one GPU by "
    "ID)."
)

FLAGS: tuple[Flag, ...] = (
    NODES,
    HOSTFILE,
    Flag(
        "slots",
        int,
        "Ranks per node on CPUs; with --gpus, one rank per GPU: leave it out or give the same count.",
        "SLOTS_PER_WORKER",
        "1",
        "slots",
    ),
    Flag("gpus", str, GPUS, "GPUS_PER_NODE", to="gpus", spellings=("--gpus", "--gpus-per-node")),
    Flag("image", str, "Image to run.", "IMAGE", DEFAULT_IMAGE, "image"),
    Flag(
        "spares",
        str,
        "Comma-separated hosts kept in reserve, HOST or HOST:SLOTS: each gets a worker, started and checked as the "
        "nodes' are, out of the hostfile until a restart (--max-restarts) puts it in a lost node's place; `launcher "
        "status` lists them as role=spare.",
        "SPARES",
        to="spares",
    ),
    Flag(
        "device",
        tuple,
        "A host device for every worker, HOST[:CONTAINER] (repeatable), e.g. /dev/infiniband so NCCL uses RDMA "
        "instead of sockets.",
        "DEVICES",
        to="devices",
    ),
    Flag("push_image", bool, PUSH_IMAGE, to="push_image"),
    ENV_FILE,
    INSECURE,
    *(job_flag(item.name) for item in fields(JobOptions) if item.metadata.get("flag")),
    Flag(
        "detach",
        bool,
        "Return once training runs; follow with `launcher logs --follow`; every container stops when the job ends.",
        to="detach",
    ),
    Flag(
        "keep_running",
        bool,
        "With --detach: keep the containers running after the job ends, for debugging (`launcher stop` removes them).",
        to="keep_running",
    ),
    Flag("debug", bool, "NCCL_DEBUG=INFO for every rank: NCCL's topology and transports.", shown="WARN, errors only"),
    Flag(
        "ranks",
        str,
        "Show only these ranks' lines of the job's output here, e.g. 0 or 0,3 (the job agent's own lines too); the "
        "job's log keeps every rank's: `launcher logs --rank N` while the job runs, job.log in its run folder after.",
        shown="every line",
        to="ranks",
    ),
    Flag(
        "dry_run",
        bool,
        "Run every check a start runs and print the plan (containers, hostfile, mpirun line); start nothing.",
    ),
)
"""`launcher start`'s flags, in --help's order: where the job runs, the job's own options (JobOptions), then how
this command follows it."""
ROWS = {row.name: row for row in FLAGS}


def start_settings(given: Mapping[str, Any], command: tuple[str, ...]) -> dict[str, Any]:
    """resolve_settings's keyword arguments from `launcher start`'s flags as the command line gave them (by row
    name), each row's value where its `to` says, the job options' under `job`; None where a flag was not given (.env
    or the default decides)."""
    chosen: dict[str, Any] = {}
    job: dict[str, Any] = {"command": command}
    for row in FLAGS:
        if row.to is None:
            continue
        value = row.value(given.get(row.name))
        if row.to.startswith(JOB):
            job[row.to[len(JOB) :]] = value
        else:
            chosen[row.to] = value
    job["env"] = (*job["env"], *([NCCL_DEBUG] if given.get("debug") else []))
    return {**chosen, "job": job}


READING_IMAGE = (
    "Image whose short-lived containers read the nodes' shared folder, which any of the stack's images can (default: "
    "IMAGE in .env, else the image the node's cluster ran, else one of the stack's images the node holds: none is "
    "pulled)."
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
    "gpus": "Check for these GPUs too: " + ROWS["gpus"].text,
    "links": "Also measure every pair of nodes' link both ways (rate and round trip, between host-network containers "
    "of the image, over the job's NIC, on the SSH port) and predict one ring allreduce and one parameter-server "
    "exchange on the slowest link, with one line of advice against the compute per step.",
    "gradient_mb": "With --links: the gradient to predict for, in MB (default: the bundled trainer's SimpleNet).",
    "link_seconds": f"With --links: the longest each direction of a pair streams (default {LINK_SECONDS:g} s).",
    "compute_ms": "With --links: the compute of one training step in ms, for the advice (default: the bundled "
    "trainer's, measured once on rank 0's node; needed with --gradient-mb).",
    "push_image": PUSH_IMAGE + " Then every check runs on every node, --links too; a start needs no copy.",
}
