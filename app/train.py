"""`python -m app.train`: the bundled trainer, one process per rank, on whichever framework this environment holds.

The article's SimpleNet on MNIST (or its offline stand-ins) with Horovod: app.train_torch on PyTorch's image
(horovod-stack:latest), app.train_keras (Keras 3) on TensorFlow's (horovod-stack:tensorflow). Both take the same
options (app/config.py) and write the same files (metrics.jsonl, summary.json, checkpoints/, curves.png), so every
launch method starts either one with the same command (app/entrypoint.py). Launch it under horovodrun or mpirun, e.g.
    horovodrun -np 2 -H localhost:2 --gloo python -m app.train --dataset digits
    mpirun -np 2 -bind-to none -map-by slot python -m app.train --dataset digits
"""

from __future__ import annotations

import importlib
import sys

from app import frameworks


def main(argv: list[str] | None = None) -> int:
    framework = frameworks.installed()
    if framework is None:
        names = " or ".join(f"{f.name} ({f.image})" for f in frameworks.FRAMEWORKS)
        print(f"error: neither PyTorch nor TensorFlow is installed here: run the trainer in {names}", file=sys.stderr)
        return 2
    trainer = importlib.import_module(framework.trainer)
    return int(trainer.main(argv))


if __name__ == "__main__":
    sys.exit(main())
