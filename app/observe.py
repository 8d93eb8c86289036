"""What rank 0 shows and records while training: a progress bar or plain progress lines per epoch, TensorBoard
scalars per logging step and per epoch, and at the end curves.png. Every other rank gets a silent Observer.

The trainer calls three hooks: step() for every batch, epoch() once an epoch's metrics record is complete,
finish() after the last epoch.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from app import frameworks, metrics
from app.config import TrainConfig

if TYPE_CHECKING:
    from tqdm import tqdm

log = logging.getLogger("app.observe")

EPOCH_SCALARS = {
    "epoch/train_loss": "train_loss",
    "epoch/val_loss": "val_loss",
    "epoch/val_accuracy": "val_accuracy",
    "epoch/lr": "lr",
    "epoch/samples_per_sec": "samples_per_sec",
    "epoch/world_size": "world_size",
}
"""TensorBoard tag -> metrics record field, written with step = epoch."""
STEP_SCALARS = ("step/loss", "step/lr")
"""Written at every logging step, with step = global batch number (1-based)."""


class ScalarWriter(Protocol):
    """What the Observer writes TensorBoard scalars through: torch's SummaryWriter, or TensorFlowWriter."""

    def add_scalar(self, tag: str, value: float, step: int) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class TensorFlowWriter:
    """TensorBoard scalars through tf.summary, for the TensorFlow image (torch's SummaryWriter needs torch)."""

    def __init__(self, log_dir: str) -> None:
        import tensorflow as tf

        self.tf = tf
        self.writer = tf.summary.create_file_writer(log_dir)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        with self.writer.as_default():
            self.tf.summary.scalar(tag, value, step=step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def open_writer(log_dir: str) -> ScalarWriter:
    """An event file in log_dir through the framework this environment holds (imports tensorboard: only when asked)."""
    if frameworks.installed() is frameworks.PYTORCH:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(log_dir=log_dir)
    return TensorFlowWriter(log_dir)


def wants_bar(mode: str, stream: TextIO) -> bool:
    """`auto`: a bar only on a terminal. Open MPI hands every rank a pty of its own whatever mpirun's output is
    (a file, a pipe, a container log), so under mpirun a terminal cannot be told and auto means lines."""
    if mode != "auto":
        return mode == "bar"
    return stream.isatty() and "OMPI_COMM_WORLD_SIZE" not in os.environ


class Observer:
    def __init__(self, config: TrainConfig, enabled: bool, stream: TextIO | None = None) -> None:
        self.config = config
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self.use_bar = enabled and wants_bar(config.progress, self.stream)
        self.bar: tqdm | None = None
        self.writer: ScalarWriter | None = None
        if enabled and config.tensorboard_dir is not None:
            self.writer = open_writer(str(config.tensorboard_dir))

    def set_enabled(self, enabled: bool) -> None:
        """Elastic jobs renumber ranks on a reset: whoever is rank 0 now records."""
        if enabled and not self.enabled:
            Observer.__init__(self, self.config, True, self.stream)
        self.enabled = enabled

    def step(self, *, epoch: int, step: int, steps: int, global_step: int, loss: float, lr: float) -> None:
        """After batch `step` (1-based) of `steps` in `epoch`; `global_step` counts batches since the first."""
        if not self.enabled:
            return
        interval = self.config.log_interval or max(1, steps // 4)
        logging_step = step % interval == 0 or step == steps
        if self.use_bar:
            self._advance_bar(epoch, step, steps, loss, lr)
        elif logging_step:
            log.info("epoch %d [%d/%d batches] loss %.4f lr %.4f", epoch, step, steps, loss, lr)
        if self.writer is not None and logging_step:
            for tag, value in zip(STEP_SCALARS, (loss, lr), strict=True):
                self.writer.add_scalar(tag, value, global_step)

    def _advance_bar(self, epoch: int, step: int, steps: int, loss: float, lr: float) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(
                total=steps,
                desc=f"epoch {epoch}/{self.config.epochs}",
                unit="batch",
                file=self.stream,
                dynamic_ncols=True,
                leave=True,
            )
        self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.4f}", refresh=False)
        self.bar.update(1)
        if step == steps:
            self.bar.close()
            self.bar = None

    def epoch(self, record: dict[str, Any]) -> None:
        """A finished epoch's metrics record; flushed at once, so a running job's events can be read."""
        if self.writer is None:
            return
        for tag, field in EPOCH_SCALARS.items():
            self.writer.add_scalar(tag, record[field], record["epoch"])
        self.writer.flush()

    def finish(self) -> None:
        """Closes the event file and draws curves.png from the whole metrics file (earlier runs' epochs too,
        when resumed)."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()
        metrics_file, curves_file = self.config.metrics_file, self.config.curves_file
        if metrics_file is None or curves_file is None or not metrics_file.exists():
            return
        try:
            from app import curves  # matplotlib: rank 0 alone, once, at the end

            curves.draw(metrics.read_records(metrics_file), curves_file)
        except Exception as error:  # the training itself succeeded; a missing picture must not fail the run
            log.warning(
                "curves.png not drawn (%s: %s); `python -m app.report %s` draws it",
                type(error).__name__,
                error,
                curves_file.parent,
            )
            return
        log.info("training curves in %s", curves_file)
