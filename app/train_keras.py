"""The TensorFlow trainer (`python -m app.train` on horovod-stack:tensorflow): the article's SimpleNet in Keras 3,
data-parallel with Horovod, one process per rank, with the PyTorch trainer's options, files and log lines
(app/train_torch.py, app/run_record.py).

The run, in order: validate settings (before Horovod starts) → init Horovod, pin this rank's GPU if any → data
(MNIST fetched by local rank 0 only) → model and optimizer, built so that their variables exist, resumed from a
checkpoint if asked → broadcast rank 0's variables → per epoch: a @tf.function step per batch whose
hvd.DistributedGradientTape averages the gradients over the ranks, validation across all ranks, rank 0 logs,
records metrics and checkpoints → check that every rank ends with identical variables.

Each step deals the next batch_size x world-size samples of the epoch's permutation (the same on every rank) out
over the ranks. With --elastic the epoch loop runs under `hvd.elastic.run` with a TensorFlowKerasState: model and
optimizer variables, the epoch and how far into it training got are committed every --commit-every batches and at
each epoch's end; after a reset the rest of the epoch is dealt over whoever is there.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from app import checkpoint, consistency, datasets, gpu, metrics, observe, run_record, shared_values
from app.config import ConfigError, TrainConfig, parse_config
from app.horovod_defaults import HOROVOD_DEFAULTS
from app.run_record import EpochResult, ResetLog, setup_logging
from app.schedule import rate_at, scaled_lr

log = logging.getLogger("app.train")

IMAGE_SHAPE = (28, 28, 1)
EVAL_BATCH = 512


def simple_net(num_classes: int = 10) -> keras.Model:
    """SimpleNet (app/model.py) in Keras: two stages of a 5x5 convolution (10, then 20 maps), a 2x2 max-pool and a
    ReLU, then one dense layer over the 20x4x4 = 320 features; logits out."""
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input(IMAGE_SHAPE),
            layers.Conv2D(10, 5),
            layers.MaxPooling2D(2),
            layers.ReLU(),
            layers.Conv2D(20, 5),
            layers.MaxPooling2D(2),
            layers.ReLU(),
            layers.Flatten(),
            layers.Dense(num_classes),
        ],
        name="simplenet",
    )


def all_ranks_ok(ok: bool) -> bool:
    """A barrier that also tells every rank whether all of them succeeded."""
    flags = hvd.allreduce(tf.constant([1.0 if ok else 0.0]), op=hvd.Min, name="all_ranks_ok")
    return bool(flags.numpy()[0] == 1.0)


def load_data(config: TrainConfig) -> tuple[datasets.Arrays, datasets.Arrays]:
    """(train, val) as NHWC images and labels, the same split on every rank."""
    run_record.prepare_data(config, hvd.local_rank(), lambda: datasets.download_mnist(config.data_dir), all_ranks_ok)
    if config.dataset == "mnist":
        train, val = datasets.mnist(config.data_dir)
    elif config.dataset == "digits":
        train, val = datasets.digits(config.seed)
    else:
        train, val = datasets.synthetic(config.seed)
    return (train[0].transpose(0, 2, 3, 1), train[1]), (val[0].transpose(0, 2, 3, 1), val[1])


def make_train_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, config: TrainConfig) -> Any:
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compression = hvd.Compression.fp16 if config.fp16_allreduce else hvd.Compression.none
    op = hvd.Adasum if config.use_adasum else hvd.Average

    images_spec = tf.TensorSpec((None, *model.input_shape[1:]), tf.float32)

    @tf.function(input_signature=(images_spec, tf.TensorSpec((None,), tf.int64)))
    def train_step(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression, op=op)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    return train_step


def evaluate(model: keras.Model, val: datasets.Arrays, config: TrainConfig) -> tuple[float, float]:
    """Validation loss and accuracy over the whole split: every rank's shard summed by an allreduce."""
    images, labels = val
    mine = datasets.shard(len(labels), hvd.rank(), hvd.size(), config.seed, 0, shuffle=False)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    loss_sum, correct = 0.0, 0.0
    for start in range(0, len(mine), EVAL_BATCH):
        batch = mine[start : start + EVAL_BATCH]
        logits = model(images[batch], training=False)
        loss_sum += float(loss_fn(labels[batch], logits))
        correct += float(np.sum(np.argmax(logits, axis=1) == labels[batch]))
    totals = hvd.allreduce(tf.constant([loss_sum, correct, float(len(mine))], tf.float64), op=hvd.Sum, name="val")
    loss_total, correct_total, count = totals.numpy()
    return loss_total / count, correct_total / count


def sum_over_ranks(loss_sum: float, seen: int) -> tuple[float, int]:
    """(mean training loss, samples) over every rank's part of an epoch."""
    totals = hvd.allreduce(tf.constant([loss_sum, float(seen)], tf.float64), op=hvd.Sum, name="train_totals")
    loss_total, count = totals.numpy()
    return loss_total / max(count, 1.0), int(count)


class FixedProgress:
    """A fixed-size job's place in training: the elastic state's attributes, with nothing to commit."""

    def __init__(self, epoch: int) -> None:
        self.epoch, self.done, self.result = epoch, 0, None

    def commit(self) -> None:
        pass

    def save(self) -> None:
        pass

    def check_host_updates(self) -> None:
        pass


def train(
    config: TrainConfig,
    progress: Any,
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    data: tuple[datasets.Arrays, datasets.Arrays],
    resets: ResetLog,
    observer: observe.Observer,
) -> EpochResult | None:
    """The epoch loop, for both kinds of job: `progress` is FixedProgress or the elastic state (epoch, done: samples
    of the epoch trained on, result), committed every --commit-every batches."""
    (images, labels), val = data
    train_step = make_train_step(model, optimizer, config)
    count = len(labels)
    while progress.epoch <= config.epochs:
        epoch, started = progress.epoch, time.perf_counter()
        order = np.random.default_rng(config.seed + epoch).permutation(count)
        steps = -(-(count - progress.done) // (config.batch_size * hvd.size()))
        loss_sum, seen, step = 0.0, 0, 0
        while progress.done < count:
            batch, dealt = datasets.deal(order, progress.done, config.batch_size, hvd.rank(), hvd.size())
            target_lr = scaled_lr(config.base_lr, hvd.size(), config.use_adasum)
            lr = rate_at(epoch - 1 + progress.done / count, config.base_lr, target_lr, config.warmup_epochs)
            optimizer.learning_rate = lr
            loss = float(train_step(images[batch], labels[batch]))
            progress.done += dealt
            step += 1
            resets.stepped()
            loss_sum, seen = loss_sum + loss * len(batch), seen + len(batch)
            observer.step(epoch=epoch, step=step, steps=steps, global_step=resets.steps, loss=loss, lr=lr)
            if step % config.commit_every == 0:
                progress.commit()
        train_loss, samples = sum_over_ranks(loss_sum, seen)
        train_seconds = time.perf_counter() - started
        val_loss, val_accuracy = evaluate(model, val, config)
        progress.result = EpochResult(
            epoch, train_loss, val_loss, val_accuracy, samples / train_seconds, time.perf_counter() - started
        )
        progress.epoch, progress.done = epoch + 1, 0
        # Saved before rank 0 records the epoch: a failure from here on resumes at the next epoch, so no epoch is
        # recorded twice.
        progress.save()
        if hvd.rank() == 0:
            record_epoch(config, progress.result, model, optimizer, observer)
        progress.check_host_updates()
    return progress.result


def record_epoch(
    config: TrainConfig, result: EpochResult, model: keras.Model, optimizer: Any, observer: observe.Observer
) -> None:
    """Rank 0, after each epoch: the log line, metrics and scalars (app.run_record), then the checkpoint."""
    run_record.record_epoch(config, result, hvd.size(), float(optimizer.learning_rate.numpy()), observer)
    if config.checkpoint_dir is not None:
        checkpoint.save_arrays(
            config.checkpoint_dir,
            {"epoch": result.epoch, "dataset": config.dataset},
            {"model": [v.numpy() for v in model.variables], "optimizer": [v.numpy() for v in optimizer.variables]},
        )


def load_resume_point(config: TrainConfig, model: keras.Model, optimizer: Any) -> tuple[int, str | None]:
    """Rank 0: the first epoch to run after loading the latest checkpoint into model and optimizer, or the one-line
    problem that stops every rank (run_record.start_epoch)."""
    assert config.checkpoint_dir is not None  # TrainConfig refuses resume without it
    try:
        saved = checkpoint.load_arrays(config.checkpoint_dir)
    except checkpoint.CheckpointError as error:
        return 1, str(error)
    problem = run_record.resume_problem(config, None if saved is None else saved[0].get("dataset"))
    if saved is None or problem:
        return 1, problem
    meta, arrays = saved
    for group, variables in (("model", model.variables), ("optimizer", optimizer.variables)):
        values = arrays.get(group, [])
        if [v.shape for v in values] != [tuple(v.shape) for v in variables]:
            return 1, (
                f"the checkpoint in {config.checkpoint_dir} does not fit this trainer's {group}: "
                "pass another --checkpoint-dir"
            )
        for variable, value in zip(variables, values, strict=True):
            variable.assign(value)
    log.info("resuming from %s after epoch %d", config.checkpoint_dir / checkpoint.KERAS_LATEST, meta["epoch"])
    return int(meta["epoch"]) + 1, None


def place(config: TrainConfig) -> str:
    """Threads, and this rank's GPU (one per local rank) or none; the device, as the plan line names it."""
    tf.config.threading.set_intra_op_parallelism_threads(config.threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(2, config.threads))
    gpus = tf.config.list_physical_devices("GPU")
    if config.no_cuda or not gpus:
        tf.config.set_visible_devices([], "GPU")
        return "cpu"
    mine = gpus[hvd.local_rank() % len(gpus)]
    tf.config.experimental.set_memory_growth(mine, True)
    tf.config.set_visible_devices(mine, "GPU")
    return "cuda"


def run(config: TrainConfig) -> EpochResult | None:
    for name, value in HOROVOD_DEFAULTS.items():  # the stack's fast settings, under any launcher; env wins
        os.environ.setdefault(name, value)
    hvd.init()
    setup_logging(hvd.rank())
    device = place(config)
    keras.utils.set_random_seed(config.seed)

    train_set, val_set = load_data(config)
    model = simple_net()
    optimizer = keras.optimizers.SGD(learning_rate=config.base_lr, momentum=config.momentum)
    optimizer.build(model.trainable_variables)  # its variables exist now: checkpoints and broadcasts see them all
    start_epoch = run_record.start_epoch(
        config,
        hvd.rank(),
        lambda: load_resume_point(config, model, optimizer),
        lambda value: shared_values.broadcast(value, 0, gather_arrays, "resume_point"),
    )
    if not config.elastic:  # elastic: the state's first sync broadcasts rank 0's variables
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(optimizer.variables, root_rank=0)
    if hvd.rank() == 0 and config.metrics_file is not None:
        metrics.keep_epochs_up_to(config.metrics_file, start_epoch - 1)
    run_record.log_plan(config, hvd.size(), device, len(train_set[1]), len(val_set[1]), start_epoch)

    resets, observer = ResetLog(hvd.size), observe.Observer(config, enabled=hvd.rank() == 0)
    data = (train_set, val_set)
    if config.elastic:
        state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=start_epoch, done=0, result=None)

        def on_reset() -> None:
            setup_logging(hvd.rank())  # ranks are renumbered: whoever is rank 0 now speaks for the job
            observer.set_enabled(hvd.rank() == 0)
            resets.on_reset(state.epoch)

        state.register_reset_callbacks([on_reset])
        result = hvd.elastic.run(lambda state: train(config, state, model, optimizer, data, resets, observer))(state)
    else:
        result = train(config, FixedProgress(start_epoch), model, optimizer, data, resets, observer)
    observer.finish()

    digest = consistency.digest_arrays((v.path, v.numpy()) for v in model.variables)
    ranks = run_record.identical_ranks(
        hvd.rank(), digest, lambda mine: shared_values.allgather(mine, gather_arrays, "digests")
    )
    if hvd.rank() == 0:
        run_record.finish(config, ranks, start_epoch, result, resets)
    return result


def gather_arrays(array: np.ndarray, name: str) -> np.ndarray:
    """shared_values' one primitive on Horovod's TensorFlow ops (equal-length 1-D arrays, concatenated by rank)."""
    return hvd.allgather(tf.constant(array), name=name).numpy()


def parse_checked(argv: list[str] | None) -> TrainConfig:
    """The options, and a GPU job's refusal where TensorFlow sees no GPU (both before Horovod starts)."""
    config = parse_config(argv)
    if os.environ.get(gpu.GPUS_ASKED):
        problem = gpu.cuda_problem(
            os.environ, bool(tf.config.list_physical_devices("GPU")), config.no_cuda, gpu.TENSORFLOW_BUILD
        )
        if problem:
            raise ConfigError(problem)
    return config


def main(argv: list[str] | None = None) -> int:
    return run_record.main(parse_checked, run, argv)
