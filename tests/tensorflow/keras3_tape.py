"""Keras 3 (TensorFlow 2.21's default `keras`), a custom loop: hvd.DistributedGradientTape over
model.trainable_variables, hvd.broadcast_variables over the model's and the optimizer's variables, a @tf.function
step. Ranks start from different weights and see different data; they must end identical."""

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf
from same_weights import check

hvd.init()
keras.utils.set_random_seed(1234 + hvd.rank())  # different weights on every rank until the broadcast
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
optimizer = keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)
optimizer.build(model.trainable_variables)
hvd.broadcast_variables(model.variables, root_rank=0)
hvd.broadcast_variables(optimizer.variables, root_rank=0)  # Keras 3: a property, not a method
loss_fn = keras.losses.MeanSquaredError()
rng = np.random.default_rng(hvd.rank())
x, y = rng.normal(size=(32, 8)).astype("float32"), rng.normal(size=(32, 1)).astype("float32")


@tf.function
def step(x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    tape = hvd.DistributedGradientTape(tape)
    optimizer.apply_gradients(
        zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables, strict=True)
    )
    return loss


for _ in range(3):
    step(x, y)
check("Keras 3, DistributedGradientTape", [v.numpy() for v in model.variables + optimizer.variables])
