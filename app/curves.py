"""curves.png: a run's training curves per epoch (loss, validation accuracy, throughput), from its metrics records.

Drawn with matplotlib's Agg canvas directly (no pyplot, no global backend), so it works on hosts and in
containers without a display and leaves the process's matplotlib state alone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

SIZE_INCHES = (13.0, 3.8)
DPI = 100


def draw(records: list[dict[str, Any]], path: Path) -> Path:
    """Writes the three panels to `path` (replaced atomically, so a reader never sees half a file)."""
    epochs = [record["epoch"] for record in records]
    figure = Figure(figsize=SIZE_INCHES, dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    loss, accuracy, throughput = figure.subplots(1, 3)
    loss.plot(epochs, [r["train_loss"] for r in records], marker="o", label="train")
    loss.plot(epochs, [r["val_loss"] for r in records], marker="o", label="validation")
    loss.set(title="loss", xlabel="epoch")
    loss.legend()
    accuracy.plot(epochs, [r["val_accuracy"] for r in records], marker="o", color="tab:green")
    accuracy.set(title="validation accuracy", xlabel="epoch", ylim=(0, 1.01))
    throughput.plot(epochs, [r["samples_per_sec"] for r in records], marker="o", color="tab:purple")
    throughput.set(title="throughput (samples/s, all ranks)", xlabel="epoch", ylim=(0, None))
    for axes in (loss, accuracy, throughput):
        axes.grid(alpha=0.3)
        axes.xaxis.get_major_locator().set_params(integer=True)
    world_sizes = sorted({record["world_size"] for record in records})
    figure.suptitle(f"{path.parent.name}: {len(records)} epoch(s) on {'/'.join(map(str, world_sizes))} rank(s)")
    tmp = path.with_name(f".{path.name}.tmp")
    figure.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path
