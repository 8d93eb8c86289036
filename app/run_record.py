"""What the training loop (app.train_loop, for both trainers) says and writes, whatever the framework: the
rank-tagged log, the plan line, each epoch's line and metrics record, the elastic resets' account, the check that
every rank ends identical, summary.json, and the entry's exit statuses. Framework-free: the loop passes in what
only the framework knows (world size, gathered digests).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from app import consistency, datasets, metrics, observe, rank_error
from app.config import ConfigError, TrainConfig
from app.schedule import scaled_lr

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


def prepare_data(
    config: TrainConfig, local_rank: int, fetch_mnist: Callable[[], str | None], all_ranks_ok: Callable[[bool], bool]
) -> None:
    """Makes sure MNIST is on this node when asked for, or stops every rank with one line. `fetch_mnist` finds or
    downloads it (None, or why not); local rank 0 alone runs it, since ranks writing one folder at once corrupt each
    other's files, and the others wait in `all_ranks_ok`. Elastic: every worker checks for itself, since nothing
    collective may run before the elastic loop (a joining worker would deadlock)."""
    if config.dataset != "mnist":
        return
    if config.elastic:
        failure = fetch_mnist()
        ok = failure is None
    else:
        failure = fetch_mnist() if local_rank == 0 else None
        ok = all_ranks_ok(failure is None)
    if not ok:
        raise TrainingError(datasets.mnist_unavailable_message(config.data_dir, failure or "see local rank 0"))


def start_epoch(
    config: TrainConfig,
    rank: int,
    load_resume_point: Callable[[], tuple[int, str | None]],
    broadcast: Callable[[Any], Any],
) -> int:
    """The first epoch to run, on all ranks: rank 0 loads the latest checkpoint when resuming (`load_resume_point`:
    the epoch after it, or the one-line problem, returned rather than raised so no rank waits in a broadcast). The
    weights reach the other ranks through the broadcasts that follow (elastic: through the elastic state's first
    sync, which also carries rank 0's epoch)."""
    first, problem = 1, None
    if config.resume and rank == 0:
        first, problem = load_resume_point()
    if not config.elastic:
        first, problem = broadcast((first, problem))
    if problem:
        raise TrainingError(problem)
    return first


def resume_problem(config: TrainConfig, saved_dataset: str | None) -> str | None:
    """Rank 0, resuming: why the checkpoint found (None: none yet, which starts at epoch 1) must not be loaded."""
    if saved_dataset is None:
        log.info("no checkpoint in %s yet; starting from epoch 1", config.checkpoint_dir)
        return None
    if saved_dataset != config.dataset:
        return (
            f"the checkpoint in {config.checkpoint_dir} was trained on {saved_dataset!r}, not "
            f"{config.dataset!r}: pass --dataset {saved_dataset} or another --checkpoint-dir"
        )
    return None


def launcher_rank() -> int:
    """This process's rank as the launcher announced it, readable before Horovod starts."""
    for variable in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if variable in os.environ:
            return int(os.environ[variable])
    return 0


def setup_logging(rank: int) -> None:
    # Only rank 0 speaks at INFO; the others report warnings and errors, so a failure on any rank is seen.
    logging.basicConfig(
        stream=sys.stdout,
        format=f"%(asctime)s [rank {rank}] %(message)s",
        datefmt="%H:%M:%S",
        level=logging.INFO if rank == 0 else logging.WARNING,
        force=True,
    )


def log_plan(config: TrainConfig, size: int, device: str, train_count: int, val_count: int, start_epoch: int) -> None:
    log.info(
        "plan: %d ranks on %s, dataset %s (%d train / %d val), epochs %d-%d, batch %d per rank, "
        "lr %.4g -> %.4g over %.3g warm-up epochs, %s%s%s",
        size,
        device,
        config.dataset,
        train_count,
        val_count,
        start_epoch,
        config.epochs,
        config.batch_size,
        config.base_lr,
        scaled_lr(config.base_lr, size, config.use_adasum),
        config.warmup_epochs,
        "adasum" if config.use_adasum else "average",
        ", fp16 allreduce" if config.fp16_allreduce else "",
        f", elastic (commit every {config.commit_every} batches)" if config.elastic else "",
    )


def record_epoch(config: TrainConfig, result: EpochResult, size: int, lr: float, observer: observe.Observer) -> None:
    """Rank 0, after each epoch: the log line, the metrics record and TensorBoard's scalars (the trainer then
    checkpoints)."""
    log.info(
        "epoch %d/%d: train loss %.4f, val loss %.4f, val accuracy %.4f, %.0f samples/s, %.1f s, %d ranks",
        result.epoch,
        config.epochs,
        result.train_loss,
        result.val_loss,
        result.val_accuracy,
        result.samples_per_sec,
        result.seconds,
        size,
    )
    record = {**result.__dict__, "world_size": size, "lr": lr, "epochs": config.epochs}
    if config.metrics_file is not None:
        metrics.append_record(config.metrics_file, record)
    observer.epoch(record)


class ResetLog:
    """Each rank's account of elastic resets (rank 0 logs it): each world-size change, and how long training went
    without a step; whoever is rank 0 at the end writes it to summary.json."""

    def __init__(self, world_size: Callable[[], int]) -> None:
        self.size_now = world_size
        self.world_size = world_size()
        self.last_step = time.monotonic()
        self.steps = 0
        """Steps this process has taken (rolled-back ones included): TensorBoard's x-axis for step scalars."""
        self.pending: dict | None = None
        self.events: list[dict] = []

    def on_reset(self, epoch: int) -> None:
        new_size = self.size_now()
        log.info(
            "elastic reset in epoch %d: world size %d -> %d; back to the last commit, learning rate scaled "
            "for %d ranks",
            epoch,
            self.world_size,
            new_size,
            new_size,
        )
        self.pending = {"epoch": epoch, "from_size": self.world_size, "to_size": new_size}
        self.world_size = new_size

    def stepped(self) -> None:
        now = time.monotonic()
        if self.pending is not None:
            event = {**self.pending, "seconds_without_a_step": round(now - self.last_step, 2)}
            self.events.append(event)
            log.info(
                "first step at world size %d, %.1f s after the last step at world size %d",
                event["to_size"],
                event["seconds_without_a_step"],
                event["from_size"],
            )
            self.pending = None
        self.last_step = now
        self.steps += 1


def ipv4_addresses() -> list[str]:
    """This host's non-loopback IPv4 addresses: containers on host networking share a hostname, not these."""
    return sorted(
        address.address
        for addresses in psutil.net_if_addrs().values()
        for address in addresses
        if address.family == socket.AF_INET and not address.address.startswith("127.")
    )


def identical_ranks(rank: int, digest: str, allgather: Callable[[Any], list[Any]]) -> list[dict]:
    """Every rank's host and parameter digest, gathered on all ranks; raises if any rank differs from rank 0."""
    mine = {"rank": rank, "host": socket.gethostname(), "addresses": ipv4_addresses(), "digest": digest}
    ranks = allgather(mine)
    differing = consistency.ranks_differing_from_root([entry["digest"] for entry in ranks])
    if differing:
        raise TrainingError(
            f"parameters differ from rank 0's on ranks {differing}: the ranks diverged; "
            "check that every host runs the same image and Horovod build"
        )
    return ranks


def finish(
    config: TrainConfig, ranks: list[dict], start_epoch: int, result: EpochResult | None, resets: ResetLog
) -> None:
    """Rank 0, at the end: the line every user looks for, and summary.json."""
    log.info("parameters identical on all %d ranks (sha256 %s...)", len(ranks), ranks[0]["digest"][:12])
    if config.summary_file is not None:
        summary = {
            "world_size": len(ranks),
            "ranks": ranks,
            "epochs_run": [start_epoch, config.epochs],
            "final": result.__dict__ if result else None,
            "elastic_resets": resets.events,
        }
        config.summary_file.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def main(
    parse: Callable[[list[str] | None], TrainConfig], run: Callable[[TrainConfig], object], argv: list[str] | None
) -> int:
    """A trainer's entry: 2 for a setting refused before Horovod starts (one rank says it), 1 for a TrainingError.
    Either is said in one line, not a traceback, and its record written as an uncaught exception's would be
    (app/rank_error.py), for the job agent."""
    try:
        config = parse(argv)
    except ConfigError as error:
        if launcher_rank() == 0:  # every rank validates; one says so
            print(f"error: {error}", file=sys.stderr)
            rank_error.report(error)
        return 2
    try:
        run(config)
    except TrainingError as error:
        print(f"error: {error}", file=sys.stderr)
        rank_error.report(error)
        return 1
    return 0
