"""Horovod with Keras 3 on TensorFlow, a whole script: a small network learns scikit-learn's handwritten digits (1,797
8x8 images that ship with the library: no download), on one GPU per rank where the ranks see GPUs, on CPUs elsewhere.

    horovodrun -np 2 -H localhost:2 python keras_digits.py --epochs 5

It runs on horovod-stack:tensorflow. Through compose, `launcher start --workdir` or the smoke role: README.md, "Your
own script". Rank 0 prints each epoch's metrics (averaged over the ranks) and saves a checkpoint; at the end every rank
prints a digest of its weights, the same on every rank.
"""

import argparse
import hashlib
import os
import socket
import tempfile

import horovod.tensorflow.keras as hvd
import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

# Checkpoints go to /shared, on every worker of the stack; where that cannot be written (a smoke run), to /tmp.
SHARED = "/shared" if os.access("/shared", os.W_OK) else tempfile.gettempdir()
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.1, help="for one rank; scaled by the number of ranks")
parser.add_argument("--checkpoint-dir", default=os.path.join(SHARED, "checkpoints"))
args = parser.parse_args()

hvd.init()
gpus = tf.config.list_physical_devices("GPU")
if gpus:
    tf.config.experimental.set_memory_growth(gpus[hvd.local_rank()], True)
    tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
keras.utils.set_random_seed(0)

digits = load_digits()
x, y = (digits.data / 16).astype("float32"), digits.target
order = np.random.default_rng(0).permutation(len(x))  # the same split on every rank
train, val = order[:1440], order[1440:]
share = len(train) // hvd.size()  # an equal share each, so every rank takes as many steps
train, val = train[hvd.rank() * share : (hvd.rank() + 1) * share], val[hvd.rank() :: hvd.size()]

model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
optimizer = keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9)
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
model.compile(optimizer=hvd.DistributedOptimizer(optimizer), loss=loss, metrics=["accuracy"])
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
if hvd.rank() == 0:
    checkpoint = os.path.join(args.checkpoint_dir, "keras_digits.weights.h5")
    callbacks.append(keras.callbacks.ModelCheckpoint(checkpoint, save_weights_only=True))
history = model.fit(
    x[train],
    y[train],
    batch_size=args.batch_size,
    epochs=args.epochs,
    validation_data=(x[val], y[val]),
    callbacks=callbacks,
    verbose=2 if hvd.rank() == 0 else 0,
)

if hvd.rank() == 0:
    print(f"after {args.epochs} epochs: val accuracy {history.history['val_accuracy'][-1]:.4f}", flush=True)
digest = hashlib.sha256(b"".join(array.tobytes() for array in model.get_weights())).hexdigest()
print(f"rank {hvd.rank()} of {hvd.size()} on {socket.gethostname()}: parameters sha256 {digest[:16]}", flush=True)
