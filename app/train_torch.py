"""The PyTorch trainer (`python -m app.train` on horovod-stack:latest): data-parallel training of SimpleNet with
Horovod, one process per rank.

The run, in order: validate settings (before Horovod starts) → init Horovod → data (MNIST downloaded by local
rank 0 only) → model and optimizer, resumed from a checkpoint if asked → broadcast rank 0's state → per epoch:
train on this rank's shard, validate across all ranks, rank 0 logs, records metrics and checkpoints → check that
every rank ends with identical parameters.

With --elastic (under horovodrun's elastic mode) the epoch loop runs inside `hvd.elastic.run`: model, optimizer,
sampler position and epoch are committed every --commit-every batches and at each epoch's end; when a worker is
lost the others roll back to the last commit and go on at the smaller world size, and new workers join at the
next commit. Nothing collective may run before that loop in elastic mode (a joining worker would deadlock).

Launch it under horovodrun or mpirun, e.g.
    horovodrun -np 2 -H localhost:2 --gloo python -m app.train --dataset digits
    mpirun -np 2 -bind-to none -map-by slot python -m app.train --dataset digits
    horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script ./hosts.sh python -m app.train --elastic
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sized
from typing import cast

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from app import checkpoint, consistency, data, gpu, metrics, observe, run_record, shared_values
from app.config import ConfigError, TrainConfig, parse_config
from app.horovod_defaults import HOROVOD_DEFAULTS
from app.model import SimpleNet
from app.run_record import EpochResult, ResetLog, setup_logging
from app.schedule import learning_rate, rate_at, scaled_lr

log = logging.getLogger("app.train")


def all_ranks_ok(ok: bool) -> bool:
    """A barrier that also tells every rank whether all of them succeeded."""
    flags = hvd.allreduce(torch.tensor([1.0 if ok else 0.0]), op=hvd.Min, name="all_ranks_ok")
    return bool(flags.item() == 1.0)


def load_data(config: TrainConfig) -> tuple[Dataset, Dataset]:
    run_record.prepare_data(config, hvd.local_rank(), lambda: data.prepare_mnist(config.data_dir), all_ranks_ok)
    return data.load_dataset(config.dataset, config.data_dir, config.seed)


def dataset_size(dataset: Dataset) -> int:
    """How many samples a map-style dataset holds (torch's Dataset type does not say it has a length)."""
    return len(cast(Sized, dataset))


def make_loader(dataset: Dataset, config: TrainConfig, shuffle: bool) -> tuple[DataLoader, DistributedSampler]:
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=shuffle, seed=config.seed
    )
    return DataLoader(dataset, batch_size=config.batch_size, sampler=sampler), sampler


def train_step(model, optimizer, images: torch.Tensor, labels: torch.Tensor, lr: float) -> float:
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad()
    loss = F.nll_loss(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


def train_epoch(
    epoch: int,
    model,
    optimizer,
    loader: DataLoader,
    sampler: DistributedSampler,
    config: TrainConfig,
    device: torch.device,
    target_lr: float,
    observer: observe.Observer,
) -> tuple[float, int]:
    """One pass over this rank's shard. Returns (mean loss over all ranks, samples seen by all ranks)."""
    model.train()
    sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
    steps = len(loader)
    loss_sum, seen = 0.0, 0
    for step, (images, labels) in enumerate(loader):
        global_step = (epoch - 1) * steps + step
        lr = learning_rate(global_step, steps, config.base_lr, target_lr, config.warmup_epochs)
        loss = train_step(model, optimizer, images.to(device), labels.to(device), lr)
        loss_sum += loss * len(labels)
        seen += len(labels)
        observer.step(epoch=epoch, step=step + 1, steps=steps, global_step=global_step + 1, loss=loss, lr=lr)
    return sum_over_ranks(loss_sum, seen)


def sum_over_ranks(loss_sum: float, seen: int) -> tuple[float, int]:
    """(mean training loss, samples) over every rank's part of an epoch."""
    totals = hvd.allreduce(torch.tensor([loss_sum, float(seen)], dtype=torch.float64), op=hvd.Sum, name="train_totals")
    return (totals[0] / max(totals[1], 1.0)).item(), int(totals[1].item())


def evaluate(model, loader: DataLoader, device: torch.device) -> tuple[float, float]:
    """Validation loss and accuracy over the whole split: every rank's shard summed by an allreduce."""
    model.eval()
    loss_sum, correct, count = 0.0, 0.0, 0.0
    with torch.no_grad():
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            output = model(images)
            loss_sum += F.nll_loss(output, labels, reduction="sum").item()
            correct += (output.argmax(dim=1) == labels).sum().item()
            count += len(labels)
    totals = hvd.allreduce(torch.tensor([loss_sum, correct, count], dtype=torch.float64), op=hvd.Sum, name="val_totals")
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


def load_resume_point(config: TrainConfig, model, optimizer) -> tuple[int, str | None]:
    """Rank 0: the first epoch to run after loading the latest checkpoint into model and optimizer, or the
    one-line problem that stops every rank (run_record.start_epoch)."""
    assert config.checkpoint_dir is not None  # TrainConfig refuses resume without it
    try:
        state = checkpoint.load_latest_checkpoint(config.checkpoint_dir)
    except checkpoint.CheckpointError as error:
        return 1, str(error)
    problem = run_record.resume_problem(config, None if state is None else state["dataset"])
    if state is None or problem:
        return 1, problem
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    log.info("resuming from %s after epoch %d", config.checkpoint_dir / checkpoint.LATEST, state["epoch"])
    return state["epoch"] + 1, None


def record_epoch(config: TrainConfig, result: EpochResult, model, optimizer, observer: observe.Observer) -> None:
    """Rank 0, after each epoch: the log line, metrics and scalars (app.run_record), then the checkpoint."""
    run_record.record_epoch(config, result, hvd.size(), optimizer.param_groups[0]["lr"], observer)
    if config.checkpoint_dir is not None:
        checkpoint.save_checkpoint(
            config.checkpoint_dir,
            {
                "epoch": result.epoch,
                "dataset": config.dataset,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
            },
        )


def fixed_size_training(
    config: TrainConfig,
    model,
    optimizer,
    train_set: Dataset,
    val_set: Dataset,
    device: torch.device,
    start_epoch: int,
    observer: observe.Observer,
) -> EpochResult | None:
    train_loader, train_sampler = make_loader(train_set, config, shuffle=True)
    val_loader, val_sampler = make_loader(val_set, config, shuffle=False)
    target_lr = scaled_lr(config.base_lr, hvd.size(), config.use_adasum)
    result = None
    for epoch in range(start_epoch, config.epochs + 1):
        started = time.perf_counter()
        train_loss, samples = train_epoch(
            epoch, model, optimizer, train_loader, train_sampler, config, device, target_lr, observer
        )
        train_seconds = time.perf_counter() - started
        val_sampler.set_epoch(epoch)
        val_loss, val_accuracy = evaluate(model, val_loader, device)
        result = EpochResult(
            epoch, train_loss, val_loss, val_accuracy, samples / train_seconds, time.perf_counter() - started
        )
        if hvd.rank() == 0:
            record_epoch(config, result, model, optimizer, observer)
    return result


def elastic_training(
    config: TrainConfig,
    model,
    optimizer,
    train_set: Dataset,
    val_set: Dataset,
    device: torch.device,
    start_epoch: int,
    resets: ResetLog,
    observer: observe.Observer,
) -> EpochResult | None:
    """The epoch loop under `hvd.elastic.run`. The elastic sampler hands out only the samples of the epoch not
    yet trained on, re-sharded over whoever is there after each reset; an epoch's loss and throughput cover the
    part of it run since the last reset."""
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=config.seed)
    sampler.set_epoch(start_epoch)
    loader = DataLoader(train_set, batch_size=config.batch_size, sampler=sampler)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=start_epoch, result=None)

    def on_reset() -> None:
        setup_logging(hvd.rank())  # ranks are renumbered: whoever is rank 0 now speaks for the job
        observer.set_enabled(hvd.rank() == 0)
        sampler.reset()  # re-shard the rest of the epoch over the new world (a removal skips the state sync)
        resets.on_reset(state.epoch)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state) -> EpochResult | None:
        while state.epoch <= config.epochs:
            epoch, started = state.epoch, time.perf_counter()
            model.train()
            loss_sum, seen = 0.0, 0
            for step, (images, labels) in enumerate(loader):
                target_lr = scaled_lr(config.base_lr, hvd.size(), config.use_adasum)
                lr = rate_at(
                    epoch - 1 + sampler.processed_num / dataset_size(train_set),
                    config.base_lr,
                    target_lr,
                    config.warmup_epochs,
                )
                loss = train_step(model, optimizer, images.to(device), labels.to(device), lr)
                sampler.record_batch(step, config.batch_size)
                resets.stepped()
                loss_sum += loss * len(labels)
                seen += len(labels)
                observer.step(epoch=epoch, step=step + 1, steps=len(loader), global_step=resets.steps, loss=loss, lr=lr)
                if (step + 1) % config.commit_every == 0:
                    state.commit()
            train_loss, samples = sum_over_ranks(loss_sum, seen)
            train_seconds = time.perf_counter() - started
            val_loss, val_accuracy = evaluate(model, make_loader(val_set, config, shuffle=False)[0], device)
            state.result = EpochResult(
                epoch, train_loss, val_loss, val_accuracy, samples / train_seconds, time.perf_counter() - started
            )
            state.epoch = epoch + 1
            sampler.set_epoch(state.epoch)
            # Saved before rank 0 records the epoch: a failure from here on resumes at the next epoch, so no epoch
            # is recorded twice.
            state.save()
            if hvd.rank() == 0:
                record_epoch(config, state.result, model, optimizer, observer)
            state.check_host_updates()
        return state.result

    return train(state)


def run(config: TrainConfig) -> EpochResult | None:
    for name, value in HOROVOD_DEFAULTS.items():  # the stack's fast settings, under any launcher; env wins
        os.environ.setdefault(name, value)
    hvd.init()
    setup_logging(hvd.rank())
    torch.manual_seed(config.seed)
    torch.set_num_threads(config.threads)
    use_cuda = torch.cuda.is_available() and not config.no_cuda
    if use_cuda:
        torch.cuda.set_device(hvd.local_rank())
        torch.cuda.manual_seed(config.seed)
    device = torch.device("cuda" if use_cuda else "cpu")

    train_set, val_set = load_data(config)
    model = SimpleNet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.base_lr, momentum=config.momentum)
    start_epoch = run_record.start_epoch(
        config,
        hvd.rank(),
        lambda: load_resume_point(config, model, optimizer),
        lambda value: shared_values.broadcast(value, 0, gather_arrays, "resume_point"),
    )
    if not config.elastic:  # elastic: the state's first sync broadcasts rank 0's model and optimizer
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if config.fp16_allreduce else hvd.Compression.none,
        op=hvd.Adasum if config.use_adasum else hvd.Average,
    )

    if hvd.rank() == 0 and config.metrics_file is not None:
        metrics.keep_epochs_up_to(config.metrics_file, start_epoch - 1)

    run_record.log_plan(config, hvd.size(), str(device), dataset_size(train_set), dataset_size(val_set), start_epoch)

    resets, observer = ResetLog(hvd.size), observe.Observer(config, enabled=hvd.rank() == 0)
    if config.elastic:
        result = elastic_training(config, model, optimizer, train_set, val_set, device, start_epoch, resets, observer)
    else:
        result = fixed_size_training(config, model, optimizer, train_set, val_set, device, start_epoch, observer)
    observer.finish()

    ranks = run_record.identical_ranks(
        hvd.rank(),
        consistency.parameter_digest(model),
        lambda mine: shared_values.allgather(mine, gather_arrays, "parameter_digests"),
    )
    if hvd.rank() == 0:
        run_record.finish(config, ranks, start_epoch, result, resets)
    return result


def gather_arrays(array: np.ndarray, name: str) -> np.ndarray:
    """shared_values' one primitive on Horovod's torch ops (equal-length 1-D arrays, concatenated in rank order)."""
    return hvd.allgather(torch.from_numpy(array), name=name).numpy()


def parse_checked(argv: list[str] | None) -> TrainConfig:
    """The options, and a GPU job's refusal where CUDA cannot serve it (both before Horovod starts)."""
    config = parse_config(argv)
    problem = gpu.cuda_problem(os.environ, torch.cuda.is_available(), config.no_cuda)
    if problem:
        raise ConfigError(problem)
    return config


def main(argv: list[str] | None = None) -> int:
    return run_record.main(parse_checked, run, argv)


if __name__ == "__main__":
    sys.exit(main())
