"""`python -m app.train`: data-parallel training of SimpleNet with Horovod, one process per rank.

The run, in order: validate settings (before Horovod starts) → init Horovod → data (MNIST downloaded by local
rank 0 only) → model and optimizer, resumed from a checkpoint if asked → broadcast rank 0's state → per epoch:
train on this rank's shard, validate across all ranks, rank 0 logs, records metrics and checkpoints → check that
every rank ends with identical parameters.

Launch it under horovodrun or mpirun, e.g.
    horovodrun -np 2 -H localhost:2 --gloo python -m app.train --dataset digits
    mpirun -np 2 -bind-to none -map-by slot python -m app.train --dataset digits
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass

import horovod.torch as hvd
import psutil
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from app import checkpoint, consistency, data, metrics
from app.config import ConfigError, TrainConfig, parse_config
from app.model import SimpleNet
from app.schedule import learning_rate, scaled_lr
from launcher.plan import HOROVOD_DEFAULTS

log = logging.getLogger("app.train")


class TrainingError(RuntimeError):
    """A failure after start-up that ends the run on every rank with one message."""


@dataclass
class EpochResult:
    epoch: int
    train_loss: float
    val_loss: float
    val_accuracy: float
    samples_per_sec: float
    seconds: float


def launcher_rank() -> int:
    """This process's rank as the launcher announced it, readable before hvd.init()."""
    for variable in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if variable in os.environ:
            return int(os.environ[variable])
    return 0


def setup_logging(rank: int) -> None:
    # Only rank 0 speaks at INFO; the others report warnings and errors, so a failure on any rank is seen.
    logging.basicConfig(stream=sys.stdout, format=f"%(asctime)s [rank {rank}] %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO if rank == 0 else logging.WARNING, force=True)


def all_ranks_ok(ok: bool) -> bool:
    """A barrier that also tells every rank whether all of them succeeded."""
    flags = hvd.allreduce(torch.tensor([1.0 if ok else 0.0]), op=hvd.Min, name="all_ranks_ok")
    return bool(flags.item() == 1.0)


def load_data(config: TrainConfig) -> tuple[Dataset, Dataset]:
    if config.dataset == "mnist":
        failure = data.prepare_mnist(config.data_dir) if hvd.local_rank() == 0 else None
        if not all_ranks_ok(failure is None):
            raise TrainingError(data.mnist_unavailable_message(config.data_dir, failure or "see local rank 0"))
    return data.load_dataset(config.dataset, config.data_dir, config.seed)


def make_loader(dataset: Dataset, config: TrainConfig, shuffle: bool) -> tuple[DataLoader, DistributedSampler]:
    sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=shuffle,
                                 seed=config.seed)
    return DataLoader(dataset, batch_size=config.batch_size, sampler=sampler), sampler


def train_epoch(epoch: int, model, optimizer, loader: DataLoader, sampler: DistributedSampler,
                config: TrainConfig, device: torch.device, target_lr: float) -> tuple[float, int]:
    """One pass over this rank's shard. Returns (mean loss over all ranks, samples seen by all ranks)."""
    model.train()
    sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
    steps = len(loader)
    interval = config.log_interval or max(1, steps // 4)
    loss_sum, seen = 0.0, 0
    for step, (images, labels) in enumerate(loader):
        global_step = (epoch - 1) * steps + step
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(global_step, steps, config.base_lr, target_lr, config.warmup_epochs)
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(images), labels)
        loss.backward()
        optimizer.step()
        loss_sum += loss.item() * len(labels)
        seen += len(labels)
        if (step + 1) % interval == 0 or step + 1 == steps:
            log.info("epoch %d [%d/%d batches] loss %.4f lr %.4f", epoch, step + 1, steps, loss.item(),
                     optimizer.param_groups[0]["lr"])
    totals = hvd.allreduce(torch.tensor([loss_sum, float(seen)], dtype=torch.float64), op=hvd.Sum,
                           name="train_totals")
    return (totals[0] / totals[1]).item(), int(totals[1].item())


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
    totals = hvd.allreduce(torch.tensor([loss_sum, correct, count], dtype=torch.float64), op=hvd.Sum,
                           name="val_totals")
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


def restore(config: TrainConfig, model, optimizer) -> int:
    """Loads the latest checkpoint on rank 0 (when resuming) and returns the first epoch to run, on all ranks.
    The weights and optimizer state reach the other ranks through the broadcasts that follow."""
    start_epoch, problem = 1, None
    if config.resume and hvd.rank() == 0:
        state = checkpoint.load_latest_checkpoint(config.checkpoint_dir)
        if state is None:
            log.info("no checkpoint in %s yet; starting from epoch 1", config.checkpoint_dir)
        elif state["dataset"] != config.dataset:
            problem = (f"the checkpoint in {config.checkpoint_dir} was trained on {state['dataset']!r}, not "
                       f"{config.dataset!r}: pass --dataset {state['dataset']} or another --checkpoint-dir")
        else:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start_epoch = state["epoch"] + 1
            log.info("resuming from %s after epoch %d", config.checkpoint_dir / checkpoint.LATEST, state["epoch"])
    start_epoch, problem = hvd.broadcast_object((start_epoch, problem), root_rank=0, name="resume_point")
    if problem:
        raise TrainingError(problem)
    return start_epoch


def ipv4_addresses() -> list[str]:
    """This host's non-loopback IPv4 addresses: containers on host networking share a hostname, not these."""
    return sorted(address.address for addresses in psutil.net_if_addrs().values() for address in addresses
                  if address.family == socket.AF_INET and not address.address.startswith("127."))


def verify_identical_parameters(model) -> list[dict]:
    """Every rank's host and parameter digest, gathered on all ranks; raises if any rank differs from rank 0."""
    mine = {"rank": hvd.rank(), "host": socket.gethostname(), "addresses": ipv4_addresses(),
            "digest": consistency.parameter_digest(model)}
    ranks = hvd.allgather_object(mine, name="parameter_digests")
    differing = consistency.ranks_differing_from_root([entry["digest"] for entry in ranks])
    if differing:
        raise TrainingError(f"parameters differ from rank 0's on ranks {differing}: the ranks diverged; "
                            "check that every host runs the same image and Horovod build")
    return ranks


def run(config: TrainConfig) -> EpochResult:
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
    train_loader, train_sampler = make_loader(train_set, config, shuffle=True)
    val_loader, val_sampler = make_loader(val_set, config, shuffle=False)

    model = SimpleNet().to(device)
    target_lr = scaled_lr(config.base_lr, hvd.size(), config.use_adasum)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.base_lr, momentum=config.momentum)
    start_epoch = restore(config, model, optimizer)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if config.fp16_allreduce else hvd.Compression.none,
        op=hvd.Adasum if config.use_adasum else hvd.Average)

    if hvd.rank() == 0 and config.metrics_file is not None:
        metrics.keep_epochs_up_to(config.metrics_file, start_epoch - 1)

    log.info("plan: %d ranks on %s, dataset %s (%d train / %d val), epochs %d-%d, batch %d per rank, "
             "lr %.4g -> %.4g over %.3g warm-up epochs, %s%s", hvd.size(), device, config.dataset, len(train_set),
             len(val_set), start_epoch, config.epochs, config.batch_size, config.base_lr, target_lr,
             config.warmup_epochs, "adasum" if config.use_adasum else "average",
             ", fp16 allreduce" if config.fp16_allreduce else "")

    result = None
    for epoch in range(start_epoch, config.epochs + 1):
        started = time.perf_counter()
        train_loss, samples = train_epoch(epoch, model, optimizer, train_loader, train_sampler, config, device,
                                          target_lr)
        train_seconds = time.perf_counter() - started
        val_sampler.set_epoch(epoch)
        val_loss, val_accuracy = evaluate(model, val_loader, device)
        result = EpochResult(epoch, train_loss, val_loss, val_accuracy, samples / train_seconds,
                             time.perf_counter() - started)
        if hvd.rank() == 0:
            log.info("epoch %d/%d: train loss %.4f, val loss %.4f, val accuracy %.4f, %.0f samples/s, %.1f s",
                     epoch, config.epochs, train_loss, val_loss, val_accuracy, result.samples_per_sec,
                     result.seconds)
            if config.metrics_file is not None:
                metrics.append_record(config.metrics_file, {**result.__dict__, "world_size": hvd.size()})
            if config.checkpoint_dir is not None:
                checkpoint.save_checkpoint(config.checkpoint_dir, {
                    "epoch": epoch, "dataset": config.dataset, "model": model.state_dict(),
                    "optimizer": optimizer.state_dict()})

    ranks = verify_identical_parameters(model)
    if hvd.rank() == 0:
        log.info("parameters identical on all %d ranks (sha256 %s...)", hvd.size(), ranks[0]["digest"][:12])
        if config.summary_file is not None:
            summary = {"world_size": hvd.size(), "ranks": ranks, "epochs_run": [start_epoch, config.epochs],
                       "final": result.__dict__ if result else None}
            config.summary_file.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return result


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_config(argv)
    except ConfigError as error:
        if launcher_rank() == 0:  # every rank validates; one says so
            print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        run(config)
    except TrainingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
