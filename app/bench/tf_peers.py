"""`python -m app.bench tf-peers`, in the TensorFlow image: Horovod (MPI ops, the stack's defaults) beside
TensorFlow's own peer, `tf.distribute.MultiWorkerMirroredStrategy` (its collectives over gRPC, ring), with the same
Keras model, per-rank batch, threads and ranks, synthetic data.

    docker run --rm horovod-stack:tensorflow python -m app.bench tf-peers [--models simplenet resnet50] [--ranks 2]
        [--repeats 3] [--batch 32] [--out bench-out]

Each configuration is one job: warm-up steps, then timed steps (forward, backward, the gradients' exchange, the
optimizer's update; the step ends when its loss is on the host). A step's time is the slowest rank's. Both peers run
once per round, round-robin, so both meet the same machine load; a row gives the median over rounds and the spread,
and "Horovod's speed-up" is the strategy's step time over Horovod's within each round, then the median (above 1.0:
Horovod is faster).

Horovod steps with the trainer's own step (app/train_keras.py's make_train_step: `hvd.DistributedGradientTape` in a
`tf.function`); the strategy's step is the same model, loss and optimizer under `strategy.run`, its loss divided by
the global batch so that both average the gradients over every rank's examples.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from app.bench import ranks as launch
from app.bench.report import median_spread, slowest_rank_median, write_report
from app.horovod_defaults import HOROVOD_DEFAULTS

PEERS = {"hvd-tf": "Horovod (MPI)", "mwms": "MultiWorkerMirroredStrategy"}
MODELS = {"simplenet": (28, 28, 1), "resnet50": (32, 32, 3)}
STEPS = {"simplenet": (20, 200), "resnet50": (2, 8)}
"""Warm-up and timed steps per model: a few seconds each on one core."""


# --- rank side ------------------------------------------------------------------------------------------------
def build_model(name: str):
    import keras

    if name == "simplenet":
        from app.train_keras import simple_net

        return simple_net()
    return keras.applications.ResNet50(weights=None, input_shape=MODELS[name], classes=10)


def horovod_step(model_name: str, batch: int):
    """(step, rank): the trainer's Horovod step over one synthetic batch, the model broadcast from rank 0 first."""
    import horovod.tensorflow as hvd
    import keras

    from app.config import TrainConfig
    from app.train_keras import make_train_step

    hvd.init()
    model, optimizer = build_model(model_name), keras.optimizers.SGD(0.01, momentum=0.5)
    train_step = make_train_step(model, optimizer, TrainConfig())
    images, labels = synthetic_batch(model_name, batch)
    train_step(images, labels)  # builds the optimizer's variables before they are broadcast
    hvd.broadcast_variables(model.variables + list(optimizer.variables), root_rank=0)
    return (lambda: float(train_step(images, labels))), hvd.rank()


def strategy_step(model_name: str, batch: int):
    """(step, rank): the same model, loss and optimizer under MultiWorkerMirroredStrategy (TF_CONFIG names the
    workers), one replica per worker; the optimizer sums the replicas' gradients of loss / global batch."""
    import keras
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    global_batch = batch * strategy.num_replicas_in_sync
    with strategy.scope():
        model, optimizer = build_model(model_name), keras.optimizers.SGD(0.01, momentum=0.5)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    images, labels = synthetic_batch(model_name, batch)

    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(loss_fn(labels, model(images, training=True))) / global_batch
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_step(images, labels):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(images, labels)), axis=None)

    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    return (lambda: float(train_step(images, labels))), rank


def synthetic_batch(model_name: str, batch: int):
    import tensorflow as tf

    generator = tf.random.Generator.from_seed(0)
    images = generator.normal((batch, *MODELS[model_name]))
    labels = generator.uniform((batch,), maxval=10, dtype=tf.int64)
    return images, labels


def rank_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", required=True, choices=PEERS)
    parser.add_argument("--result", required=True)
    parser.add_argument("--model", required=True, choices=MODELS)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args(argv)

    import time

    import tensorflow as tf

    tf.config.set_visible_devices([], "GPU")
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    step, rank = (horovod_step if args.peer == "hvd-tf" else strategy_step)(args.model, args.batch)
    timings = []
    for index in range(args.warmup + args.steps):
        started = time.perf_counter()
        step()
        if index >= args.warmup:
            timings.append(time.perf_counter() - started)
    Path(f"{args.result}.{rank}").write_text(json.dumps(timings))


# --- driver ---------------------------------------------------------------------------------------------------
def run_peer(peer: str, ranks: int, model: str, batch: int, short: bool) -> float:
    """One job of `ranks` ranks; the median over timed steps of the slowest rank's step, in seconds."""
    warmup, steps = (2, 3) if short else STEPS[model]
    with tempfile.TemporaryDirectory(prefix="bench-") as work:
        result = Path(work) / "result"
        command = [sys.executable, "-m", "app.bench.worker", "tf-peers", "--peer", peer, "--result", str(result),
                   "--model", model, "--batch", str(batch), "--warmup", str(warmup), "--steps", str(steps)]  # fmt: skip
        env = launch.bench_env(dict(HOROVOD_DEFAULTS) if peer == "hvd-tf" else {})
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        log = Path(work) / "output.log"
        with open(log, "w") as out:
            if peer == "hvd-tf":
                argv = launch.launcher_argv("hvd-mpi", ranks, dict(HOROVOD_DEFAULTS)) + ["-x", "TF_CPP_MIN_LOG_LEVEL"]
                processes = [subprocess.Popen(argv + command, cwd=launch.REPO, stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True, env=env)]  # fmt: skip
            else:
                workers = [f"127.0.0.1:{launch.free_port()}" for _ in range(ranks)]
                processes = [
                    subprocess.Popen(command, cwd=launch.REPO, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True, env={**env, "TF_CONFIG": json.dumps(
                                         {"cluster": {"worker": workers}, "task": {"type": "worker", "index": r}})})
                    for r in range(ranks)
                ]  # fmt: skip
            codes = launch.wait_all(processes, timeout=900)
        files = [Path(f"{result}.{rank}") for rank in range(ranks)]
        if any(codes) or not all(file.exists() for file in files):
            raise RuntimeError(f"{peer} job on {model} failed (exit {codes}):\n" + log.read_text()[-3000:])
        per_rank = [json.loads(file.read_text()) for file in files]
    return slowest_rank_median(per_rank)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m app.bench tf-peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32, help="examples per rank and step")
    parser.add_argument("--repeats", type=int, default=3, help="rounds, each running both peers")
    parser.add_argument("--short", action="store_true", help="CI: simplenet, one round, 3 timed steps")
    parser.add_argument("--out", default="bench-out")
    args = parser.parse_args(argv)
    models, repeats = (["simplenet"], 1) if args.short else (args.models, args.repeats)
    rows = []
    for model in models:
        rounds: dict[str, list[float]] = {peer: [] for peer in PEERS}
        for round_number in range(1, repeats + 1):
            for peer in PEERS:
                rounds[peer].append(run_peer(peer, args.ranks, model, args.batch, args.short))
            print(f"[tf-peers] {model}: round {round_number}/{repeats} done", flush=True)
        rows.append(peer_row(model, rounds, args.ranks * args.batch))
    columns = [("model", "model", "")]
    for peer, label in PEERS.items():
        columns += [(f"{peer}_ms", f"{label} ms/step", ".1f"), (f"{peer}_spread", "min-max", "")]
        columns += [(f"{peer}_throughput", "samples/s", ".0f")]
    columns += [("speedup", "Horovod's speed-up", ".2f")]
    title = (f"Horovod vs MultiWorkerMirroredStrategy, {args.ranks} ranks on one host (1 thread each), "
             f"batch {args.batch} per rank, median of {repeats} round(s)")  # fmt: skip
    write_report(args.out, "tf-peers", title, columns, rows, extra={"ranks": args.ranks, "batch": args.batch},
                 notes=["speed-up = the strategy's step time / Horovod's, per round, then the median."])  # fmt: skip
    return {"rows": rows}


def peer_row(model: str, rounds: dict[str, list[float]], global_batch: int) -> dict:
    """One table row from each peer's per-round step seconds."""
    row: dict = {"model": model}
    for peer, seconds in rounds.items():
        middle, low, high = median_spread(seconds)
        row.update({f"{peer}_ms": middle * 1e3, f"{peer}_spread": f"{low * 1e3:.1f}-{high * 1e3:.1f}",
                    f"{peer}_throughput": global_batch / middle})  # fmt: skip
    ratios = [mwms / hvd for hvd, mwms in zip(rounds["hvd-tf"], rounds["mwms"], strict=True)]
    row["speedup"] = statistics.median(ratios)
    return row
