"""Ranks per node: how many ranks one worker runs (a node's container under the launcher, compose's worker, an MPIJob's
worker pod), from the slots and the GPUs it was given. One rule for every launch method:

- with GPUs, one rank per GPU: the GPUs imply the slots, and slots given as well must be the same count (a
  different one is refused in one line naming the fix, rather than one of the two silently winning);
- without GPUs, the slots given, else 1.

Each launch method names the two counts in its own words (RankNames: the launcher's and the export's flags, compose's
.env keys). A node's own count (`--nodes HOST:N`, a hostfile's `slots=N`) is that node's, GPUs or not (the plan's).

And which ranks each node runs in a fixed-size job (mpirun's `-map-by slot` fills the hostfile in order), in the one
line the job agent says at each run's start and `launcher logs --node` reads back.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.core.options import SettingsError


@dataclass(frozen=True)
class RankNames:
    """How a launch method's one-line errors name its slots and GPUs: templates taking the value (`--slots {}`,
    `SLOTS_PER_WORKER={}`), and what to drop where slots and GPUs disagree."""

    slots: str
    gpus: str
    drop: str


LAUNCHER = RankNames("--slots {}", "--gpus {}", "--slots (or SLOTS_PER_WORKER in .env), or give it the GPU count")
COMPOSE = RankNames("SLOTS_PER_WORKER={}", "GPUS={}", "SLOTS_PER_WORKER from .env, or set it to GPUS")
MPIJOB = RankNames("--slots {}", "--gpus-per-node {}", "--slots")


def ranks_problem(slots: int | None, gpus: int, names: RankNames) -> str | None:
    """Why `slots` (None: not given) and `gpus` (0: CPU ranks) cannot be a worker's ranks, in one line naming the fix;
    None if they can."""
    if slots is not None and slots < 1:
        return f"{names.slots.format(slots)}: a worker runs at least 1 rank; give 1 or more"
    if gpus < 0:
        return f"{names.gpus.format(gpus)}: give 0 (CPU ranks) or more"
    if gpus and slots is not None and slots != gpus:
        return (
            f"{names.slots.format(slots)} with {names.gpus.format(gpus)}: a GPU worker runs one rank per GPU; drop "
            f"{names.drop}"
        )
    return None


def ranks_per_node(slots: int | None, gpus: int, names: RankNames) -> int:
    """A worker's ranks: one per GPU, else the slots given, else 1; raises SettingsError with ranks_problem's line
    where the counts do not go together."""
    problem = ranks_problem(slots, gpus, names)
    if problem:
        raise SettingsError(problem)
    return gpus or slots or 1


# --- where each rank runs -----------------------------------------------------------------------------------------
PLACEMENT = "ranks by node: "
"""How the job agent's line starts that says, as each run of a fixed-size job starts, which ranks each node runs:
`ranks by node: node_1 0-1, node_2 2`. `launcher logs --node` reads it from the job's output, so a restart on other
nodes moves the ranks it shows."""


def placement_line(counts: list[tuple[str, int]]) -> str:
    """The placement of ranks on nodes given in hostfile order with their rank counts, as mpirun's `-map-by slot`
    places them: the first node's ranks first."""
    parts, first = [], 0
    for node, count in counts:
        last = first + count - 1
        parts.append(f"{node} {first}" if count == 1 else f"{node} {first}-{last}")
        first = last + 1
    return PLACEMENT + ", ".join(parts)


def read_placement(text: str) -> dict[str, range] | None:
    """Each node's ranks from a placement line (what follows PLACEMENT), or None when `text` is not one."""
    if not text.startswith(PLACEMENT):
        return None
    placement = {}
    for part in text[len(PLACEMENT) :].split(", "):
        node, _, ranks = part.strip().rpartition(" ")
        first, _, last = ranks.partition("-")
        if not node or not first.isdigit() or not (last or first).isdigit():
            return None
        placement[node] = range(int(first), int(last or first) + 1)
    return placement


def parse_ranks(text: str, source: str = "--ranks") -> frozenset[int]:
    """The ranks a comma-separated list names (`0`, `0,3`); one SettingsError naming `source` and the fix for
    anything else (a word, a negative number, no rank at all)."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    wrong = next((item for item in items if not (item.isascii() and item.isdigit())), None)
    if wrong is not None or not items:
        what = f"{wrong!r} is not a rank" if wrong is not None else "it names no rank"
        raise SettingsError(f"{source} {text!r}: {what}; pass rank numbers from 0, e.g. {source} 0 or {source} 0,3")
    return frozenset(int(item) for item in items)
