"""The bundled trainer's compute per step on this machine, alone: `python -m app.step_time` prints one JSON line,
{"step_s": ..., "batch": ..., "threads": ..., "steps": ...}.

SimpleNet on a synthetic batch of the trainer's default size with its default threads (app/config.py), no Horovod:
forward, backward and the optimizer step, the median of --steps after --warmup. `launcher doctor --links` runs it
once in a container of the image on rank 0's node and holds the predicted exchange against it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from app.config import TrainConfig


def main(argv: list[str] | None = None) -> int:
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(prog="python -m app.step_time", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=defaults.batch_size)
    parser.add_argument("--threads", type=int, default=defaults.threads)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)

    import torch

    from app.bench.peers import build_model, timed_steps

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build_model("simplenet")
    optimizer = torch.optim.SGD(model.parameters(), lr=defaults.base_lr, momentum=defaults.momentum)
    timings, _ = timed_steps("simplenet", model, optimizer, args.batch, args.warmup, args.steps, torch.device("cpu"))
    print(
        json.dumps(
            {"step_s": statistics.median(timings), "batch": args.batch, "threads": args.threads, "steps": args.steps}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
