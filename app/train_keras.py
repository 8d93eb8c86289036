"""The TensorFlow trainer (`python -m app.train` on horovod-stack:tensorflow): the article's SimpleNet in Keras 3,
data-parallel with Horovod, one process per rank. The run itself is app/train_loop.py's, as for PyTorch; this
module is what TensorFlow and Keras do their own way.

- Placement: this rank's GPU (one per local rank) with memory growth, or none.
- Data: app.datasets' arrays as NHWC. Each step deals the next batch_size x world-size samples of the epoch's
  permutation (the same on every rank) out over the ranks; after an elastic reset the rest of the epoch is dealt
  over whoever is there.
- A step: a @tf.function whose hvd.DistributedGradientTape averages the gradients over the ranks, then Keras 3's
  SGD with momentum, built up front so that checkpoints and broadcasts see every variable.
- Checkpoints: `latest.npz`, the model's and the optimizer's variables as arrays (app/checkpoint.py).
- Elastic: Horovod's TensorFlowKerasState over model and optimizer, with how far into the epoch training got.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from app import checkpoint, datasets, gpu, train_loop
from app.config import TrainConfig
from app.train_loop import Batch, Reduction, Saved

IMAGE_SHAPE = (28, 28, 1)
EVAL_BATCH = 512
REDUCTIONS = {"sum": hvd.Sum, "min": hvd.Min}


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


def load_data(config: TrainConfig) -> tuple[datasets.Arrays, datasets.Arrays]:
    """(train, val) as NHWC images and labels, the same split on every rank."""
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


class KerasTrainer:
    """app.train_loop.FrameworkTrainer on TensorFlow and Keras 3."""

    hvd = hvd
    checkpoint_file = checkpoint.KERAS_LATEST

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.model: keras.Model
        self.optimizer: Any
        self.train: datasets.Arrays
        self.val: datasets.Arrays
        self.train_step: Any

    def place(self) -> str:
        config = self.config
        tf.config.threading.set_intra_op_parallelism_threads(config.threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(2, config.threads))
        gpus = tf.config.list_physical_devices("GPU")
        if config.no_cuda or not gpus:
            tf.config.set_visible_devices([], "GPU")
            device = "cpu"
        else:
            mine = gpus[hvd.local_rank() % len(gpus)]
            tf.config.experimental.set_memory_growth(mine, True)
            tf.config.set_visible_devices(mine, "GPU")
            device = "cuda"
        keras.utils.set_random_seed(config.seed)
        return device

    def fetch_mnist(self) -> str | None:
        return datasets.download_mnist(self.config.data_dir)

    def load_data(self) -> tuple[int, int]:
        self.train, self.val = load_data(self.config)
        return len(self.train[1]), len(self.val[1])

    def build(self) -> None:
        self.model = simple_net()
        self.optimizer = keras.optimizers.SGD(learning_rate=self.config.base_lr, momentum=self.config.momentum)
        self.optimizer.build(self.model.trainable_variables)  # its variables exist now: checkpoints see them all

    def read_checkpoint(self, directory: Path) -> Saved | None:
        saved = checkpoint.load_arrays(directory)
        if saved is None:
            return None
        meta, arrays = saved
        return Saved(int(meta["epoch"]), meta.get("dataset"), arrays)

    def restore(self, saved: Saved) -> str | None:
        for group, variables in (("model", self.model.variables), ("optimizer", self.optimizer.variables)):
            values = saved.content.get(group, [])
            if [v.shape for v in values] != [tuple(v.shape) for v in variables]:
                return (
                    f"the checkpoint in {self.config.checkpoint_dir} does not fit this trainer's {group}: "
                    "pass another --checkpoint-dir"
                )
            for variable, value in zip(variables, values, strict=True):
                variable.assign(value)
        return None

    def write_checkpoint(self, directory: Path, meta: dict[str, Any]) -> None:
        arrays = {
            "model": [v.numpy() for v in self.model.variables],
            "optimizer": [v.numpy() for v in self.optimizer.variables],
        }
        checkpoint.save_arrays(directory, meta, arrays)

    def broadcast_initial_state(self) -> None:
        hvd.broadcast_variables(self.model.variables, root_rank=0)
        hvd.broadcast_variables(self.optimizer.variables, root_rank=0)

    def begin(self, start_epoch: int) -> None:
        self.train_step = make_train_step(self.model, self.optimizer, self.config)

    def progress_fields(self) -> dict[str, Any]:
        return {"done": 0}  # samples of the epoch's permutation trained on

    def elastic_state(self, **fields: Any) -> Any:
        state = hvd.elastic.TensorFlowKerasState(self.model, self.optimizer, **fields)
        state.register_reset_callbacks([lambda: self.begin(state.epoch)])  # the step traced again after a reset
        return state

    def batches(self, epoch: int, progress: Any) -> Iterator[Batch]:
        config, (images, labels) = self.config, self.train
        count = len(labels)
        order = np.random.default_rng(config.seed + epoch).permutation(count)
        steps = -(-(count - progress.done) // (config.batch_size * hvd.size()))
        while progress.done < count:
            batch, dealt = datasets.deal(order, progress.done, config.batch_size, hvd.rank(), hvd.size())
            train = partial(self.take_step, progress, images[batch], labels[batch], dealt)
            yield Batch(progress.done / count, steps, len(batch), train)

    def take_step(self, progress: Any, images: np.ndarray, labels: np.ndarray, dealt: int, lr: float) -> float:
        self.optimizer.learning_rate = lr
        loss = float(self.train_step(images, labels))
        progress.done += dealt
        return loss

    def next_epoch(self, progress: Any, epoch: int) -> None:
        progress.done = 0

    def evaluate(self) -> tuple[float, float, int]:
        images, labels = self.val
        mine = datasets.shard(len(labels), hvd.rank(), hvd.size(), self.config.seed, 0, shuffle=False)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
        loss_sum, correct = 0.0, 0.0
        for start in range(0, len(mine), EVAL_BATCH):
            batch = mine[start : start + EVAL_BATCH]
            logits = self.model(images[batch], training=False)
            loss_sum += float(loss_fn(labels[batch], logits))
            correct += float(np.sum(np.argmax(logits, axis=1) == labels[batch]))
        return loss_sum, correct, len(mine)

    def learning_rate(self) -> float:
        return float(self.optimizer.learning_rate.numpy())

    def named_arrays(self) -> Iterable[tuple[str, np.ndarray]]:
        return ((v.path, v.numpy()) for v in self.model.variables)

    def allreduce(self, values: np.ndarray, op: Reduction, name: str) -> np.ndarray:
        return hvd.allreduce(tf.constant(values, tf.float64), op=REDUCTIONS[op], name=name).numpy()

    def allgather(self, array: np.ndarray, name: str) -> np.ndarray:
        return hvd.allgather(tf.constant(array), name=name).numpy()


def cuda_available() -> bool:
    return bool(tf.config.list_physical_devices("GPU"))


def main(argv: list[str] | None = None) -> int:
    return train_loop.main(argv, KerasTrainer, gpu.TENSORFLOW_BUILD, cuda_available)
