"""Keras 3, model.fit: horovod.tensorflow.keras's DistributedOptimizer wrapping a Keras 3 optimizer, with
BroadcastGlobalVariablesCallback and MetricAverageCallback. Ranks start apart and see different data; they must end
identical, their averaged metrics too."""

import numpy as np
import keras
import horovod.tensorflow.keras as hvd

from same_weights import check

hvd.init()
keras.utils.set_random_seed(1234 + hvd.rank())
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)),
              loss="mse", metrics=["mae"])
rng = np.random.default_rng(hvd.rank())
x, y = rng.normal(size=(64, 8)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[
    hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()])
metrics = [value for values in history.history.values() for value in values]
check("Keras 3, model.fit with DistributedOptimizer", [v.numpy() for v in model.variables] + [metrics])
