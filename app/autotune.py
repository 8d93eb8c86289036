"""What Horovod's autotuner chose, from its log: `python -m app.autotune RUN/autotune.csv` (also written beside the
log as autotune.json by the job agent, `launcher start --autotune`, compose's AUTOTUNE=1).

With HOROVOD_AUTOTUNE=1 Horovod's coordinator tries settings while the job trains (Bayesian optimisation of the
fusion threshold, 0-64 MB, and the cycle time, 1-100 ms; then hierarchical allreduce and allgather, torus allreduce
and the response cache, on and off), scoring each by the bytes it allreduced per microsecond over a few steps.
HOROVOD_AUTOTUNE_LOG gets one CSV row per scored sample and, once tuning ends, one last row with the best settings,
whose score repeats the best sample's: that repeat is how the end of tuning is told from a job that stopped before
it. After tuning, the job keeps the best settings for the rest of the run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

LOG = "autotune.csv"
RECORD = "autotune.json"
FLAGS = ("hierarchical_allreduce", "hierarchical_allgather", "torus_allreduce", "cache_enabled")


def read_log(text: str) -> dict:
    """The autotune log as a record: whether tuning finished, how many samples were scored, and the settings chosen
    (the final row once tuning finished, else the best-scoring sample so far); {"samples": 0} for a log without
    rows."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return {"samples": 0, "finished": False}
    header = [name.strip() for name in lines[0].split(",")]
    rows = [dict(zip(header, (cell.strip() for cell in line.split(",")), strict=False)) for line in lines[1:]]
    rows = [row for row in rows if row.get("score")]
    if not rows:
        return {"samples": 0, "finished": False}
    finished = len(rows) >= 2 and any(row["score"] == rows[-1]["score"] for row in rows[:-1])
    chosen = rows[-1] if finished else max(rows, key=lambda row: float(row["score"]))
    return {
        "finished": finished,
        "samples": len(rows) - (1 if finished else 0),
        "chosen": {
            "cycle_time_ms": float(chosen["cycle_time_ms"]),
            "fusion_threshold_mb": float(chosen["tensor_fusion_threshold"]),
            **{flag: chosen.get(flag) == "1" for flag in FLAGS},
        },
        "score_mb_per_s": float(chosen["score"]),
    }


def line(record: dict) -> str:
    """The record in one line."""
    if not record.get("samples"):
        return (
            "autotune: no sample scored (the job ended before the first one: fewer steps than "
            "HOROVOD_AUTOTUNE_WARMUP_SAMPLES + 1 samples of HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE steps)"
        )
    chosen = record["chosen"]
    flags = ", ".join(f"{flag.replace('_', ' ')} {'on' if chosen[flag] else 'off'}" for flag in FLAGS)
    settings = f"cycle {chosen['cycle_time_ms']:.3g} ms, fusion {chosen['fusion_threshold_mb']:.3g} MB, {flags}"
    if record["finished"]:
        return f"autotune: chose {settings} (best of {record['samples']} samples, {record['score_mb_per_s']:.4g} MB/s)"
    return (
        f"autotune: not finished after {record['samples']} samples (the job ended first); best so far: {settings} "
        f"({record['score_mb_per_s']:.4g} MB/s)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.autotune", description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path)
    args = parser.parse_args(argv)
    record = read_log(args.log.read_text())
    print(line(record))
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
