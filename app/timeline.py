"""What a Horovod timeline says, in a few numbers: `python -m app.timeline RUN/timeline.json`.

Horovod's coordinator (rank 0) writes the timeline (HOROVOD_TIMELINE; `launcher start --timeline`, compose's
TIMELINE=1) in Chrome's trace format, one "process" per tensor. Per tensor and step it records:

- the negotiation, `NEGOTIATE_ALLREDUCE` (B .. E), with one instant event per rank, named by its number, when that
  rank said the tensor was ready: the rank that comes last is the one the others wait for;
- the data, `ALLREDUCE` (B .. E; the end's args give dtype and shape), with its activities inside:
  `WAIT_FOR_DATA`, `MEMCPY_IN_FUSION_BUFFER`, the collective itself (`MPI_ALLREDUCE`, `GLOO_ALLREDUCE`,
  `NCCL_ALLREDUCE`, `MPI_ADASUM_ALLREDUCE`), `MEMCPY_OUT_FUSION_BUFFER`.

Tensors fused into one buffer share one collective: their collective activities overlap in time, while Horovod's
background thread runs one collective after another. `summarize` counts, for the allreduces (the gradients; not
broadcasts or allgathers), per step (a step: one allreduce of the tensor allreduced most often) the negotiations, the
tensors' data operations and the collectives on the wire, and gives each collective's fused size. Stdlib-only, so
the launcher's job agent can summarize a run's timeline.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

FILE = "timeline.json"
"""Its name in a run folder."""
DATA_OPERATIONS = ("ALLREDUCE", "ADASUM")
"""The data phases of a gradient exchange (Horovod's response types); broadcasts and allgathers are left out."""
NEGOTIATIONS = tuple(f"NEGOTIATE_{name}" for name in DATA_OPERATIONS)
COLLECTIVE = re.compile(r"^(MPI|GLOO|NCCL|CCL)_(ADASUM_)?ALLREDUCE$")
"""The activity that is the collective itself (its bytes on the wire), not a copy into or out of the fusion buffer."""
DTYPE_BYTES = {"FLOAT16": 2, "BFLOAT16": 2, "FLOAT32": 4, "FLOAT64": 8, "INT32": 4, "INT64": 8, "UINT8": 1, "INT8": 1}


@dataclass
class Summary:
    tensors: int = 0
    """Tensors allreduced at least once."""
    steps: int = 0
    negotiations: int = 0
    data_operations: int = 0
    collectives: list[float] = field(default_factory=list)
    """Each collective's fused size, MB (1e6 bytes), in time order."""
    ranks: list[int] = field(default_factory=list)
    """The ranks that reported tensors ready in the negotiations."""

    def per_step(self, count: float) -> float:
        return count / self.steps if self.steps else 0.0

    def line(self) -> str:
        """One line: per step, negotiations vs data operations, collectives and their fused sizes."""
        if not self.steps:
            return f"{self.tensors} tensors, no complete data operation recorded"
        sizes = sorted(self.collectives)
        fused = (
            f"fused sizes {sizes[0]:.3g}-{sizes[-1]:.3g} MB (median {statistics.median(sizes):.3g} MB)"
            if sizes
            else "no collective recorded"
        )
        return (
            f"{self.tensors} tensors, allreduced over {self.steps} steps; per step "
            f"{self.per_step(self.negotiations):.1f} negotiations and "
            f"{self.per_step(self.data_operations):.1f} data operations in "
            f"{self.per_step(len(self.collectives)):.1f} collectives; {fused}; ranks in the negotiations: "
            f"{','.join(map(str, self.ranks)) or 'none'}"
        )


def tensor_bytes(args: dict) -> int:
    """A data operation's end args ({"dtype": "HOROVOD_FLOAT32", "shape": "[64, 3, 7, 7]"}) as bytes."""
    dtype = str(args.get("dtype", "")).removeprefix("HOROVOD_")
    dims = [int(dim) for dim in re.findall(r"\d+", str(args.get("shape", "")))]
    count = 1
    for dim in dims:
        count *= dim
    return count * DTYPE_BYTES.get(dtype, 4) if "shape" in args else 0


def summarize(events: list[dict]) -> Summary:
    """The timeline's events (Horovod's JSON list) in a few numbers (module docstring)."""
    open_phases: dict[int, list[tuple[str, int]]] = {}
    operations: Counter[int] = Counter()
    negotiations = 0
    ranks: set[int] = set()
    intervals: list[tuple[int, int, int]] = []
    """(start, end, pid) of each collective activity."""
    pending_bytes: dict[int, list[int]] = {}
    """Per tensor: the indexes of its collectives still waiting for the operation's end (which gives the size)."""
    sizes: dict[int, int] = {}
    for event in sorted((e for e in events if e.get("ph") in ("B", "E", "X")), key=lambda e: e.get("ts", 0)):
        pid, phase, ts = int(event.get("pid", 0)), event["ph"], int(event.get("ts", 0))
        stack = open_phases.setdefault(pid, [])
        if phase == "X":
            if stack and stack[-1][0].startswith("NEGOTIATE_") and str(event.get("name", "")).isdigit():
                ranks.add(int(event["name"]))
            continue
        if phase == "B":
            name = str(event.get("name", ""))
            stack.append((name, ts))
            if name in NEGOTIATIONS:
                negotiations += 1
            continue
        if not stack:
            continue
        name, started = stack.pop()
        if COLLECTIVE.match(name):
            intervals.append((started, ts, pid))
            pending_bytes.setdefault(pid, []).append(len(intervals) - 1)
        elif name in DATA_OPERATIONS:
            operations[pid] += 1
            size = tensor_bytes(event.get("args", {}))
            for index in pending_bytes.pop(pid, []):
                sizes[index] = size
    collectives: list[float] = []
    group_end, group_bytes = None, 0
    for index, (start, end, _) in sorted(enumerate(intervals), key=lambda item: item[1][0]):
        if group_end is not None and start < group_end:
            group_end, group_bytes = max(group_end, end), group_bytes + sizes.get(index, 0)
            continue
        if group_end is not None:
            collectives.append(group_bytes / 1e6)
        group_end, group_bytes = end, sizes.get(index, 0)
    if group_end is not None:
        collectives.append(group_bytes / 1e6)
    return Summary(
        tensors=len(operations),
        steps=max(operations.values(), default=0),
        negotiations=negotiations,
        data_operations=sum(operations.values()),
        collectives=collectives,
        ranks=sorted(ranks),
    )


def load(path: str | Path) -> list[dict]:
    """A timeline file's events (parse)."""
    return parse(Path(path).read_text())


def parse(text: str) -> list[dict]:
    """A timeline's events. Horovod closes the list after every event; a file cut short mid-event (a killed job) is
    read up to its last complete event."""
    try:
        return json.loads(text)
    except ValueError:
        cut = text.rfind("},")
        return json.loads(text[: cut + 1] + "]") if cut > 0 else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.timeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("timeline", type=Path)
    args = parser.parse_args(argv)
    print(summarize(load(args.timeline)).line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
