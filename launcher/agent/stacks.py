"""Every rank's Python stack, on demand (`launcher stacks`) and when a job stalls (the job agent's stall watch).

In each worker container, `python -m launcher.agent.stacks collect --node NAME [--native]` finds the rank processes (by
the rank Open MPI or horovodrun gave them) and dumps each one's stack with py-spy, as JSON. The caller (the job agent,
over ssh to every worker; a Slurm batch script's stall watch, launcher/agent/batch_stall.py) groups the ranks so that
identical stacks print once, naming where each group is: "rank 1 (node_2 pid 88) in wait_for_data at stall.py:14".
The grouping and the wording are pure functions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK")
"""How a process knows it is a rank: Open MPI's variable (mpirun), or Horovod's (elastic horovodrun)."""
PY_SPY_TIMEOUT_SECONDS = 20
CAP_SYS_PTRACE = 19
NO_PTRACE = (
    "no stacks: the workers run without SYS_PTRACE (started with --no-ptrace, or PTRACE=0 in .env; an MPIJob exported "
    "without --ptrace)"
)
LIBRARY_MARKS = ("/site-packages/", "/dist-packages/", "/lib/python3")
"""Paths of installed packages and the standard library: a frame elsewhere is the user's own code."""


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"

    @property
    def where(self) -> str:
        return f"{self.function} at {Path(self.file).name}:{self.line}"

    @property
    def is_library(self) -> bool:
        return any(mark in self.file for mark in LIBRARY_MARKS)


@dataclass(frozen=True)
class RankStack:
    rank: int
    node: str
    pid: int
    frames: tuple[Frame, ...] = ()
    """The rank's main thread, innermost frame first."""
    error: str | None = None
    """Why no stack could be taken (py-spy's own message)."""

    @property
    def label(self) -> str:
        return f"{self.node} pid {self.pid}"


@dataclass
class Group:
    """Ranks whose stacks are the same."""

    frames: tuple[Frame, ...]
    error: str | None
    ranks: list[RankStack] = field(default_factory=list)

    @property
    def numbers(self) -> str:
        ranks = sorted(stack.rank for stack in self.ranks)
        return f"rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}"

    @property
    def in_horovod(self) -> bool:
        return any("/horovod/" in frame.file for frame in self.frames)

    def where(self) -> str:
        if self.error:
            return f"no stack ({self.error})"
        if not self.frames:
            return "no Python frame"
        innermost = self.frames[0]
        own = next((frame for frame in self.frames if not frame.is_library), None)
        if own is None or own == innermost:
            return f"in {innermost.where}"
        return f"in {innermost.where}, from {own.where}"

    def headline(self) -> str:
        nodes = ", ".join(stack.label for stack in sorted(self.ranks, key=lambda stack: stack.rank))
        return f"{self.numbers} ({nodes}) {self.where()}"


def group(stacks: list[RankStack]) -> list[Group]:
    """Ranks with identical stacks together, the groups in the order of their lowest rank."""
    groups: dict[tuple, Group] = {}
    for stack in sorted(stacks, key=lambda stack: stack.rank):
        key = (stack.frames, stack.error)
        groups.setdefault(key, Group(stack.frames, stack.error)).ranks.append(stack)
    return list(groups.values())


def odd_ones_out(groups: list[Group]) -> list[Group]:
    """The groups a hang is most likely about: those not waiting inside Horovod while others are (a rank that never
    reached the collective the rest wait in); failing that, all but the largest group."""
    outside = [found for found in groups if not found.in_horovod]
    if outside and len(outside) < len(groups):
        return outside
    largest = max((len(found.ranks) for found in groups), default=0)
    smaller = [found for found in groups if len(found.ranks) < largest]
    return smaller or groups


def report(stacks: list[RankStack]) -> str:
    """Every group's headline, then its frames (innermost first), as `launcher stacks` prints them."""
    if not stacks:
        return "no rank process found (is a job running?)\n"
    lines = []
    for found in group(stacks):
        lines.append(found.headline())
        lines += [f"    {frame}" for frame in found.frames]
    return "\n".join(lines) + "\n"


def summary(stacks: list[RankStack]) -> str:
    """One line naming the odd ranks out and where the others are, for `launcher status` and a stall's error."""
    groups = group(stacks)
    odd = odd_ones_out(groups)
    rest = [found for found in groups if found not in odd]
    text = "; ".join(found.headline() for found in odd)
    if rest:
        text += " while " + "; ".join(f"{found.numbers} {found.where()}" for found in rest)
    return text


# --- in a worker container ----------------------------------------------------------------------------------------
def rank_processes(proc: Path = Path("/proc"), only: str | None = None) -> list[tuple[int, int]]:
    """(rank, pid) for each rank process this user can see, by the rank its launcher put in its environment; `only`
    (NAME=VALUE): of those, the processes with that variable (a Slurm job's: SLURM_JOB_ID=ID, where the same user's
    other jobs may share the node)."""
    name_of, _, value_of = (only or "").partition("=")
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        variables = dict(item.split(b"=", 1) for item in environ if b"=" in item)
        if only and variables.get(name_of.encode()) != value_of.encode():
            continue
        for name in RANK_VARIABLES:
            value = variables.get(name.encode(), b"")
            if value.isdigit():
                found.append((int(value), int(entry.name)))
                break
    # A rank's children (DataLoader workers, a shell wrapper's python) inherit its rank: keep the first process.
    first: dict[int, int] = {}
    for rank, pid in sorted(found, key=lambda item: item[1]):
        first.setdefault(rank, pid)
    return sorted(first.items())


def main_thread_frames(dump: list[dict], pid: int) -> tuple[Frame, ...]:
    """The main thread's frames from py-spy's `dump --json` output (the thread whose OS id is the process id)."""
    threads = [thread for thread in dump if thread.get("os_thread_id") == pid] or dump[:1]
    return tuple(
        Frame(frame["name"], frame["filename"], int(frame["line"])) for thread in threads for frame in thread["frames"]
    )


def may_gain_ptrace(status: str) -> bool:
    """Whether SYS_PTRACE is in this process's bounding set (CapBnd in /proc/self/status), so that the kernel starts
    the image's py-spy, which asks for it (a file capability). Apptainer empties an unprivileged user's bounding set:
    there the kernel refuses to start that binary at all."""
    bound = next((line.split()[1] for line in status.splitlines() if line.startswith("CapBnd:")), None)
    return bound is None or bool(int(bound, 16) >> CAP_SYS_PTRACE & 1)


def py_spy(folder: str) -> str:
    """The py-spy to run: the image's, or where the bounding set lacks SYS_PTRACE (may_gain_ptrace), a copy of it in
    `folder` without the file capability, which reads the stacks of this user's own processes where the kernel lets
    a user trace them (Yama's ptrace_scope 0, or no Yama)."""
    found = shutil.which("py-spy")
    if found is None or may_gain_ptrace(Path("/proc/self/status").read_text()):
        return "py-spy"
    copy = Path(folder) / "py-spy"
    shutil.copyfile(found, copy)  # the contents alone: no security.capability attribute
    copy.chmod(0o700)
    return str(copy)


def dump(pid: int, native: bool, program: str = "py-spy") -> tuple[tuple[Frame, ...], str | None]:
    argv = [program, "dump", "--json", "--pid", str(pid), *(["--native"] if native else [])]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_SECONDS)
    except PermissionError as error:  # the file capability, outside the bounding set
        return (
            (),
            (
                f"py-spy: {error}; the container lacks the SYS_PTRACE capability (compose.yaml's cap_add, or a start "
                "without --no-ptrace)"
            ),
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return (), f"py-spy: {error}"
    if done.returncode != 0:
        why = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}").splitlines()[-1]
        return (), f"py-spy: {why}"
    return main_thread_frames(json.loads(done.stdout), pid), None


def collect(node: str, native: bool = False, only: str | None = None) -> list[RankStack]:
    stacks = []
    with tempfile.TemporaryDirectory(prefix="py-spy-") as folder:
        program = py_spy(folder)
        for rank, pid in rank_processes(only=only):
            frames, error = dump(pid, native, program)
            stacks.append(RankStack(rank, node, pid, frames, error))
    return stacks


def to_json(stacks: list[RankStack]) -> str:
    return json.dumps([asdict(stack) for stack in stacks])


def from_json(text: str) -> list[RankStack]:
    return [
        RankStack(
            item["rank"], item["node"], item["pid"], tuple(Frame(**frame) for frame in item["frames"]), item["error"]
        )
        for item in json.loads(text)
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.agent.stacks", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    collecting = commands.add_parser("collect", help="this container's ranks' stacks, as JSON")
    collecting.add_argument("--node", default=os.uname().nodename, help="the node's name, for the labels")
    collecting.add_argument("--native", action="store_true", help="native (C/C++) frames too")
    collecting.add_argument("--only", metavar="NAME=VALUE", help="only the ranks with this variable (SLURM_JOB_ID=ID)")
    options = parser.parse_args(argv)
    sys.stdout.write(to_json(collect(options.node, options.native, options.only)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
