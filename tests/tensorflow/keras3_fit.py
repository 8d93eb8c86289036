"""Keras 3, model.fit: horovod.tensorflow.keras's DistributedOptimizer wrapping a Keras 3 optimizer, with
BroadcastGlobalVariablesCallback, MetricAverageCallback and LearningRateWarmupCallback. Ranks start apart and see
different data; they must end identical, their averaged metrics too, and the rate must warm up to its target."""

import horovod.tensorflow.keras as hvd
import keras
import numpy as np
from same_weights import check

hvd.init()
keras.utils.set_random_seed(1234 + hvd.rank())
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(
    optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)),
    loss="mse",
    metrics=["mae"],
)
rng = np.random.default_rng(hvd.rank())
x, y = rng.normal(size=(64, 8)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
rates = []
seen = keras.callbacks.LambdaCallback(
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
check("Keras 3, model.fit with DistributedOptimizer", [v.numpy() for v in model.variables] + [metrics, rates])
