"""Keras 3, model.fit under hvd.elastic, as Horovod's examples/elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py
does it: a KerasState with CommitStateCallback, UpdateBatchStateCallback and UpdateEpochStateCallback. Each epoch says
its number and the world size; the last line, the epoch reached and the world size it ended at."""

import horovod.tensorflow.keras as hvd
import keras
import numpy as np

EPOCHS = 8

hvd.init()
keras.utils.set_random_seed(1234)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9)), loss="mse")
rng = np.random.default_rng(0)
x = rng.normal(size=(2048, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(2048, 1))).astype("float32")
state = hvd.elastic.KerasState(model, batch=0, epoch=0)
said = keras.callbacks.LambdaCallback(
    on_epoch_end=lambda epoch, logs: print(
        f"epoch {state.epoch}/{EPOCHS} at world size {hvd.size()}: loss {logs['loss']:.4f}", flush=True
    )
)


@hvd.elastic.run
def train(state):
    # Keras counts this call's epochs from 0; UpdateEpochStateCallback adds the epochs done before the reset.
    model.fit(
        x,
        y,
        batch_size=8,
        epochs=EPOCHS - state.epoch,
        verbose=0,
        callbacks=[
            hvd.elastic.CommitStateCallback(state, batches_per_commit=10),
            hvd.elastic.UpdateBatchStateCallback(state),
            hvd.elastic.UpdateEpochStateCallback(state),
            said,
        ],
    )


train(state)
if hvd.rank() == 0:
    print(f"finished: epoch {state.epoch}/{EPOCHS} at world size {hvd.size()}", flush=True)
