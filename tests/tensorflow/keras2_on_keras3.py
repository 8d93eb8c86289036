"""Keras 2 code written for Horovod, run as it is: in the style of Horovod's examples/tensorflow2/tensorflow2_mnist.py,
tf.keras layers, tf.optimizers.SGD and opt.variables() in the first batch's broadcast inside a @tf.function step. With
TF_USE_LEGACY_KERAS=1 (Keras 2 through tf_keras) it trains; without it (Keras 3, the image's default) every rank dies
of `TypeError: 'list' object is not callable`, a Keras 3 optimizer's `variables` being a list, and the job's failure
line names the setting (launcher/core/legacy_keras.py)."""

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

hvd.init()
model = tf.keras.Sequential([tf.keras.layers.Flatten(input_shape=(12, 12, 1)), tf.keras.layers.Dense(10)])
loss = tf.losses.SparseCategoricalCrossentropy(from_logits=True)
opt = tf.optimizers.SGD(0.01 * hvd.size())
rng = np.random.default_rng(hvd.rank())
images = rng.normal(size=(16, 12, 12, 1)).astype("float32")
labels = rng.integers(0, 10, size=(16,))


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        loss_value = loss(labels, model(images, training=True))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss_value, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables(), root_rank=0)
    return loss_value


for batch in range(2):
    training_step(images, labels, batch == 0)
print(f"rank {hvd.rank()}: trained on Keras 2", flush=True)
