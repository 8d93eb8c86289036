"""Keras 2 (TF_USE_LEGACY_KERAS=1 with tf_keras), model.fit with horovod.tensorflow.keras's DistributedOptimizer and
its callbacks, as Horovod's examples/tensorflow2/tensorflow2_keras_mnist.py does it."""

import os

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from same_weights import check

assert os.environ.get("TF_USE_LEGACY_KERAS") == "1", "run with TF_USE_LEGACY_KERAS=1 (Keras 2 through tf_keras)"
hvd.init()
tf.random.set_seed(1234 + hvd.rank())
model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu", input_shape=(8,)), tf.keras.layers.Dense(1)])
opt = hvd.DistributedOptimizer(tf.optimizers.SGD(0.01 * hvd.size(), momentum=0.9))
model.compile(optimizer=opt, loss="mse", metrics=["mae"])
rng = np.random.default_rng(hvd.rank())
x, y = rng.normal(size=(64, 8)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
rates = []
seen = tf.keras.callbacks.LambdaCallback(
    on_train_batch_end=lambda batch, logs: rates.append(float(np.array(model.optimizer.learning_rate)))
)
history = model.fit(
    x,
    y,
    batch_size=16,
    epochs=2,
    verbose=0,
    callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.01 * hvd.size(), warmup_epochs=1),
        seen,
    ],
)
if not rates[0] < rates[-1] == np.float32(0.01 * hvd.size()):  # warmed up from lr / size to lr in epoch 1
    raise SystemExit(f"LearningRateWarmupCallback: the rate went {rates}, not up to {0.01 * hvd.size()}")
metrics = [value for values in history.history.values() for value in values]
check(
    "Keras 2 (tf_keras), model.fit with DistributedOptimizer", [v.numpy() for v in model.variables] + [metrics, rates]
)
