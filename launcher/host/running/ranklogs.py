"""A job's output by rank, for `launcher logs --rank N --node NODE --grep TEXT --tee DIR` and `launcher start --ranks
0,3`: which rank wrote a line, on which node it ran, which lines are shown, and the file each goes to. Pure but for
Tee, which writes the files.

A line's rank is read from the prefixes the job's output carries: the rank tag (launcher/core/ranktag.py: mpirun's
`--tag-output`, `[1,3]<stdout>:`, elastic horovodrun's, `[3]<stderr>:`), or the bundled trainer's own
(`12:00:01 [rank 3] ...`, its rank 0 alone logs).
A line with none (the job agent's, a script's untagged print) has no rank: --rank and --node leave it out.
A rank's node is read from the job agent's placement line at each run's start (launcher/core/ranks.py), so after a
restart on a spare the spare's ranks are its own.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import IO

from launcher.core.protocol import agent_message
from launcher.core.ranks import read_placement
from launcher.core.ranktag import tagged_rank
from launcher.host.engines.streams import decoded, write_decoded

TRAINER_RANK = re.compile(r"^(?:\S+ )?\[rank (\d+)\] ")
"""The bundled trainer's log lines: `HH:MM:SS [rank N] ...`."""
OTHER = "other.log"
"""--tee's file for the lines no rank wrote (the job agent's, untagged output)."""


def rank_of(line: str) -> int | None:
    """The rank that wrote `line`, or None when it does not say."""
    rank = tagged_rank(line)
    if rank is not None:
        return rank
    found = TRAINER_RANK.match(line)
    return int(found.group(1)) if found else None


def in_view(line: str, ranks: Collection[int] | None) -> bool:
    """Whether `start --ranks` shows a line of the job's output live: every line without --ranks (None), else only
    those one of `ranks` wrote (the job agent's own lines are relayed apart from the job's output)."""
    return ranks is None or rank_of(line) in ranks


def shown(line: str, rank: int | None, grep: str | None) -> bool:
    """Whether `line` is shown for --rank `rank` and --grep `grep` (None: no such filter)."""
    return in_view(line, None if rank is None else {rank}) and (grep is None or grep in line)


def lines_of(texts: Iterable[str]) -> Iterator[str]:
    """Whole lines (each with its line break, but a last one without) from text that arrives in pieces."""
    pending = ""
    for text in texts:
        pending += text
        *whole, pending = pending.split("\n")
        yield from (line + "\n" for line in whole)
    if pending:
        yield pending


def tee_name(line: str) -> str:
    """The --tee file a line goes to: rank-N.log for rank N's, OTHER for the rest."""
    rank = rank_of(line)
    return OTHER if rank is None else f"rank-{rank}.log"


class Tee:
    """--tee DIR: every line into its rank's file in DIR (made when first needed), whatever is shown."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.files: dict[str, IO[str]] = {}

    def write(self, line: str) -> None:
        name = tee_name(line)
        if name not in self.files:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.files[name] = open(self.folder / name, "w", encoding="utf-8")  # noqa: SIM115  closed in close()
        self.files[name].write(line)

    def close(self) -> list[str]:
        """Closes every file; their names, in order."""
        for handle in self.files.values():
            handle.close()
        return sorted(self.files)


def placement_in(line: str) -> dict[str, range] | None:
    """Each node's ranks, where `line` is the job agent's placement line (`[agent 12:00:01] ranks by node: ...`)."""
    message = agent_message(line)
    return None if message is None else read_placement(message)


class NodeView:
    """--node NODE: the lines of the ranks that ran on NODE, as the placement lines met so far in the stream say."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.ranks: range = range(0)
        self.placed = False
        """Whether a placement line came (an elastic job's output has none: its ranks move with each reset)."""

    def keeps(self, line: str) -> bool:
        placement = placement_in(line)
        if placement is not None:
            self.ranks, self.placed = placement.get(self.node, range(0)), True
            return False
        return rank_of(line) in self.ranks


def relay(
    texts: Iterable[str],
    out: IO[str],
    rank: int | None,
    grep: str | None,
    tee: Tee | None = None,
    node: NodeView | None = None,
) -> None:
    """The stream's lines to `out` as --rank, --node and --grep keep them, each line also into its --tee file."""
    try:
        for line in lines_of(texts):
            if tee is not None:
                tee.write(line)
            on_node = node is None or node.keeps(line)  # every line: a placement line moves the ranks it keeps
            if on_node and shown(line, rank, grep):
                out.write(line)
                out.flush()
    finally:
        if tee is not None:
            tee.close()


def show(
    own: Iterable[bytes],
    job: Iterable[bytes],
    out: IO[str],
    rank: int | None,
    grep: str | None,
    tee: Tee | None,
    node: str | None,
) -> str | None:
    """`launcher logs`: a worker's own output, then the job's, as the filters keep them; with --node, the worker's
    own output as it is and the job's lines of that node's ranks. Returns a note for stderr when --node found no
    placement to go by (an elastic job's output), else None."""
    if node is None and rank is None and grep is None and tee is None:
        write_decoded(itertools.chain(own, job), out)
        return None
    if node is None:
        relay(decoded(itertools.chain(own, job)), out, rank, grep, tee)
        return None
    write_decoded(own, out)
    view = NodeView(node)
    relay(decoded(job), out, rank, grep, tee, view)
    if view.placed:
        return None
    return (
        f"no line of the job's output is placed on {node}: an elastic job's ranks move between nodes with each "
        "reset; --rank N shows one rank's lines"
    )
