"""Keras 2 code written for Horovod, unchanged, where the user chose Keras 2 as the Keras team documents it
(TF_USE_LEGACY_KERAS=1 with tf_keras): in the style of Horovod's examples/tensorflow2/tensorflow2_mnist.py, tf.keras
layers, tf.optimizers.SGD, opt.variables() (a method in Keras 2), a @tf.function step with DistributedGradientTape
and the first batch's broadcast. Without TF_USE_LEGACY_KERAS=1 (Keras 3) it dies at opt.variables(), as Horovod's
examples do there, and the job's failure line names the setting (launcher/core/legacy_keras.py)."""

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from same_weights import check

hvd.init()
tf.random.set_seed(1234 + hvd.rank())
mnist_model = tf.keras.Sequential(
    [
        tf.keras.layers.Conv2D(4, [3, 3], activation="relu", input_shape=(12, 12, 1)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(10, activation="softmax"),
    ]
)
loss = tf.losses.SparseCategoricalCrossentropy()
opt = tf.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)
rng = np.random.default_rng(hvd.rank())
images = rng.normal(size=(16, 12, 12, 1)).astype("float32")
labels = rng.integers(0, 10, size=(16,))


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        loss_value = loss(labels, mnist_model(images, training=True))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss_value, mnist_model.trainable_variables)
    opt.apply_gradients(zip(grads, mnist_model.trainable_variables, strict=True))
    if first_batch:
        hvd.broadcast_variables(mnist_model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables(), root_rank=0)
    return loss_value


for batch in range(3):
    training_step(images, labels, batch == 0)
check("Keras 2 (tf_keras), DistributedGradientTape", [v.numpy() for v in mnist_model.variables + opt.variables()])
