"""The training run both trainers share, written once: app.train_torch and app.train_keras each supply only what
their framework does its own way (a FrameworkTrainer), and this module runs it.

The run, in order: validate settings and refuse a GPU job that would train on the CPU (before Horovod starts) →
init Horovod → place this rank (seed, threads, device) → data (MNIST fetched by local rank 0 only) → model and
optimizer, resumed from a checkpoint if asked → broadcast rank 0's state → per epoch: train on this rank's share,
validate across all ranks, rank 0 logs, records metrics and checkpoints → check that every rank ends with identical
parameters (app/run_record.py says and writes each of these).

With --elastic (under horovodrun's elastic mode) the same epoch loop runs inside `hvd.elastic.run`, as Horovod's
own examples and torchrun's agent split it: the framework gives its elastic State (model, optimizer, where in the
epoch training is), the loop commits it every --commit-every batches and saves it at each epoch's end. When a
worker is lost the others roll back to the last commit and go on at the smaller world size; new workers join at
the next commit. Nothing collective may run before that loop in elastic mode (a joining worker would deadlock).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from app import checkpoint, consistency, gpu, metrics, observe, run_record, shared_values
from app.config import ConfigError, TrainConfig, parse_config
from app.horovod_defaults import HOROVOD_DEFAULTS
from app.run_record import EpochResult, ResetLog, setup_logging
from app.schedule import rate_at, scaled_lr

log = logging.getLogger("app.train")

Reduction = Literal["sum", "min"]


@dataclass(frozen=True)
class Batch:
    """One training step of this rank, as its framework deals the epoch."""

    epochs_done: float
    """How far into the epoch training is before this step (0 to 1): the warm-up's clock."""
    steps: int
    """The epoch's steps as this rank counts them (after an elastic reset: those left)."""
    size: int
    """Samples in this rank's batch."""
    train: Callable[[float], float]
    """Takes the step at a learning rate and returns its loss (the mean over this rank's batch)."""


@dataclass(frozen=True)
class Saved:
    """A checkpoint read back: what the loop checks, and the content only the framework can load."""

    epoch: int
    dataset: str | None
    content: Any


class FrameworkTrainer(Protocol):
    """What one framework does its own way; app.train_torch.TorchTrainer and app.train_keras.KerasTrainer."""

    hvd: Any
    """The framework's Horovod module (horovod.torch, horovod.tensorflow): init, rank, size, local_rank, elastic."""
    checkpoint_file: str
    """The checkpoint's name in --checkpoint-dir, as the resume line names it."""

    def place(self) -> str:
        """Seeds, threads and this rank's device (a GPU per local rank, or the CPU); the device as the plan names it."""
        ...

    def fetch_mnist(self) -> str | None:
        """Finds or downloads MNIST under --data-dir: None, or why not."""
        ...

    def load_data(self) -> tuple[int, int]:
        """Loads --dataset; (training samples, validation samples)."""
        ...

    def build(self) -> None:
        """The model and the optimizer, with every variable a checkpoint and a broadcast see."""
        ...

    def read_checkpoint(self, directory: Path) -> Saved | None:
        """The latest checkpoint in `directory` (None: none yet); raises checkpoint.CheckpointError."""
        ...

    def restore(self, saved: Saved) -> str | None:
        """Loads a checkpoint into the model and the optimizer; the one-line problem where it does not fit."""
        ...

    def write_checkpoint(self, directory: Path, meta: dict[str, Any]) -> None:
        """Rank 0: the model and the optimizer, with `meta` (epoch, dataset), as `checkpoint_file`."""
        ...

    def broadcast_initial_state(self) -> None:
        """Rank 0's model and optimizer to every rank (a fixed-size job; elastic: the State's first sync)."""
        ...

    def begin(self, start_epoch: int) -> None:
        """What training needs once the state is settled: Horovod's distributed optimizer, the data's order."""
        ...

    def progress_fields(self) -> dict[str, Any]:
        """The framework's own fields of where training is, besides epoch and result (committed when elastic)."""
        ...

    def elastic_state(self, **fields: Any) -> Any:
        """Horovod's elastic State over the model, the optimizer and `fields`, with the framework's reset hooks."""
        ...

    def batches(self, epoch: int, progress: Any) -> Iterator[Batch]:
        """The rest of `epoch` on this rank, a step at a time, from where `progress` says training is."""
        ...

    def next_epoch(self, progress: Any, epoch: int) -> None:
        """`progress` and the data's order at the start of `epoch`."""
        ...

    def evaluate(self) -> tuple[float, float, int]:
        """This rank's share of the validation split: (summed loss, correct predictions, samples)."""
        ...

    def learning_rate(self) -> float:
        """The optimizer's learning rate now."""
        ...

    def named_arrays(self) -> Iterable[tuple[str, np.ndarray]]:
        """The model's parameters (and buffers) by name, as arrays, in a fixed order: the identity check's input."""
        ...

    def allreduce(self, values: np.ndarray, op: Reduction, name: str) -> np.ndarray:
        """float64 values reduced element-wise over every rank."""
        ...

    def allgather(self, array: np.ndarray, name: str) -> np.ndarray:
        """shared_values' primitive: equal-length 1-D arrays of every rank, concatenated in rank order."""
        ...


class FixedProgress:
    """A fixed-size job's place in training: the elastic State's fields and hooks, with nothing to commit."""

    def __init__(self, epoch: int, result: EpochResult | None = None, **fields: Any) -> None:
        self.epoch, self.result = epoch, result
        self.__dict__.update(fields)

    def commit(self) -> None:
        pass

    def save(self) -> None:
        pass

    def check_host_updates(self) -> None:
        pass


def all_ranks_ok(trainer: FrameworkTrainer, ok: bool) -> bool:
    """A barrier that also tells every rank whether all of them succeeded."""
    return bool(trainer.allreduce(np.array([1.0 if ok else 0.0]), "min", "all_ranks_ok")[0] == 1.0)


def sum_over_ranks(trainer: FrameworkTrainer, loss_sum: float, seen: int) -> tuple[float, int]:
    """(mean training loss, samples) over every rank's part of an epoch."""
    loss_total, count = trainer.allreduce(np.array([loss_sum, float(seen)]), "sum", "train_totals")
    return float(loss_total / max(count, 1.0)), int(count)


def evaluate(trainer: FrameworkTrainer) -> tuple[float, float]:
    """Validation loss and accuracy over the whole split: every rank's share summed by an allreduce."""
    loss_total, correct_total, count = trainer.allreduce(np.array(trainer.evaluate(), np.float64), "sum", "val_totals")
    return float(loss_total / count), float(correct_total / count)


def load_resume_point(config: TrainConfig, trainer: FrameworkTrainer) -> tuple[int, str | None]:
    """Rank 0: the first epoch to run after loading the latest checkpoint into model and optimizer, or the
    one-line problem that stops every rank (run_record.start_epoch)."""
    assert config.checkpoint_dir is not None  # TrainConfig refuses resume without it
    try:
        saved = trainer.read_checkpoint(config.checkpoint_dir)
    except checkpoint.CheckpointError as error:
        return 1, str(error)
    problem = run_record.resume_problem(config, None if saved is None else saved.dataset)
    if saved is None or problem:
        return 1, problem
    problem = trainer.restore(saved)
    if problem:
        return 1, problem
    log.info("resuming from %s after epoch %d", config.checkpoint_dir / trainer.checkpoint_file, saved.epoch)
    return saved.epoch + 1, None


def record_epoch(
    config: TrainConfig, trainer: FrameworkTrainer, result: EpochResult, observer: observe.Observer
) -> None:
    """Rank 0, after each epoch: the log line, metrics and scalars (app.run_record), then the checkpoint."""
    run_record.record_epoch(config, result, trainer.hvd.size(), trainer.learning_rate(), observer)
    if config.checkpoint_dir is not None:
        trainer.write_checkpoint(config.checkpoint_dir, {"epoch": result.epoch, "dataset": config.dataset})


def train_epochs(
    config: TrainConfig, trainer: FrameworkTrainer, progress: Any, resets: ResetLog, observer: observe.Observer
) -> EpochResult | None:
    """The epoch loop, for both kinds of job: `progress` is FixedProgress or the elastic State (epoch, result and
    the framework's fields), committed every --commit-every batches."""
    hvd = trainer.hvd
    while progress.epoch <= config.epochs:
        epoch, started = progress.epoch, time.perf_counter()
        loss_sum, seen = 0.0, 0
        for step, batch in enumerate(trainer.batches(epoch, progress), start=1):
            target_lr = scaled_lr(config.base_lr, hvd.size(), config.use_adasum)
            lr = rate_at(epoch - 1 + batch.epochs_done, config.base_lr, target_lr, config.warmup_epochs)
            loss = batch.train(lr)
            resets.stepped()
            loss_sum, seen = loss_sum + loss * batch.size, seen + batch.size
            # TensorBoard's step axis: the global batch number; elastic: this process's steps (the epoch's step
            # count changes with the world size).
            global_step = resets.steps if config.elastic else (epoch - 1) * batch.steps + step
            observer.step(epoch=epoch, step=step, steps=batch.steps, global_step=global_step, loss=loss, lr=lr)
            if step % config.commit_every == 0:
                progress.commit()
        train_loss, samples = sum_over_ranks(trainer, loss_sum, seen)
        train_seconds = time.perf_counter() - started
        val_loss, val_accuracy = evaluate(trainer)
        progress.result = EpochResult(
            epoch, train_loss, val_loss, val_accuracy, samples / train_seconds, time.perf_counter() - started
        )
        progress.epoch = epoch + 1
        trainer.next_epoch(progress, epoch + 1)
        # Saved before rank 0 records the epoch: a failure from here on resumes at the next epoch, so no epoch is
        # recorded twice.
        progress.save()
        if hvd.rank() == 0:
            record_epoch(config, trainer, progress.result, observer)
        progress.check_host_updates()
    result: EpochResult | None = progress.result
    return result


def elastic_training(
    config: TrainConfig,
    trainer: FrameworkTrainer,
    fields: dict[str, Any],
    resets: ResetLog,
    observer: observe.Observer,
) -> EpochResult | None:
    """The epoch loop under `hvd.elastic.run`, over the framework's elastic State."""
    hvd = trainer.hvd
    state = trainer.elastic_state(**fields)

    def on_reset() -> None:
        setup_logging(hvd.rank())  # ranks are renumbered: whoever is rank 0 now speaks for the job
        observer.set_enabled(hvd.rank() == 0)
        resets.on_reset(state.epoch)

    state.register_reset_callbacks([on_reset])
    result: EpochResult | None = hvd.elastic.run(
        lambda progress: train_epochs(config, trainer, progress, resets, observer)
    )(state)
    return result


def run(config: TrainConfig, trainer: FrameworkTrainer) -> EpochResult | None:
    hvd = trainer.hvd
    for name, value in HOROVOD_DEFAULTS.items():  # the stack's fast settings, under any launcher; env wins
        os.environ.setdefault(name, value)
    hvd.init()
    setup_logging(hvd.rank())
    device = trainer.place()

    run_record.prepare_data(config, hvd.local_rank(), trainer.fetch_mnist, lambda ok: all_ranks_ok(trainer, ok))
    train_count, val_count = trainer.load_data()
    trainer.build()
    start_epoch = run_record.start_epoch(
        config,
        hvd.rank(),
        lambda: load_resume_point(config, trainer),
        lambda value: shared_values.broadcast(value, 0, trainer.allgather, "resume_point"),
    )
    if not config.elastic:  # elastic: the state's first sync broadcasts rank 0's model and optimizer
        trainer.broadcast_initial_state()
    trainer.begin(start_epoch)
    if hvd.rank() == 0 and config.metrics_file is not None:
        metrics.keep_epochs_up_to(config.metrics_file, start_epoch - 1)
    run_record.log_plan(config, hvd.size(), device, train_count, val_count, start_epoch)

    resets, observer = ResetLog(hvd.size), observe.Observer(config, enabled=hvd.rank() == 0)
    fields = {"epoch": start_epoch, "result": None, **trainer.progress_fields()}
    if config.elastic:
        result = elastic_training(config, trainer, fields, resets, observer)
    else:
        result = train_epochs(config, trainer, FixedProgress(**fields), resets, observer)
    observer.finish()

    ranks = run_record.identical_ranks(
        hvd.rank(),
        consistency.digest_arrays(trainer.named_arrays()),
        lambda mine: shared_values.allgather(mine, trainer.allgather, "parameter_digests"),
    )
    if hvd.rank() == 0:
        run_record.finish(config, ranks, start_epoch, result, resets)
    return result


def checked_config(
    argv: list[str] | None,
    build: gpu.CudaBuild,
    cuda_available: Callable[[], bool],
    environ: Mapping[str, str] = os.environ,
) -> TrainConfig:
    """The options, and a GPU job's refusal where the framework sees no usable GPU (both before Horovod starts).
    The framework is asked only for a GPU job (gpu.gpus_asked's one rule): TensorFlow's question costs seconds."""
    config = parse_config(argv)
    problem = gpu.cuda_problem(environ, gpu.gpus_asked(environ) and cuda_available(), config.no_cuda, build)
    if problem:
        raise ConfigError(problem)
    return config


def main(
    argv: list[str] | None,
    make_trainer: Callable[[TrainConfig], FrameworkTrainer],
    build: gpu.CudaBuild,
    cuda_available: Callable[[], bool],
) -> int:
    """A framework's trainer entry: its options checked, then the run (exit statuses: run_record.main)."""
    return run_record.main(
        lambda args: checked_config(args, build, cuda_available), lambda config: run(config, make_trainer(config)), argv
    )
