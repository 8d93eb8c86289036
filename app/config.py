"""The trainer's settings: one dataclass, parsed from the command line and validated at construction.

Every check here runs before Horovod starts, so a bad value costs one line and a non-zero exit instead of
a half-started job. Each error names the flag and what to pass instead.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

DATASETS = ("mnist", "digits", "synthetic")
PROGRESS_MODES = ("auto", "bar", "lines")
RUN_DIR_LAYOUT = {
    "metrics_file": "metrics.jsonl",
    "summary_file": "summary.json",
    "checkpoint_dir": "checkpoints",
    "tensorboard_dir": "tb",
}
"""What --run-dir puts where, for each setting not given by its own flag."""


class ConfigError(ValueError):
    """A setting the trainer refuses; the message is one line that names the fix."""


@dataclass(frozen=True)
class TrainConfig:
    dataset: str = "digits"
    """mnist (torchvision's layout under data_dir), digits (scikit-learn's 8x8 handwritten digits scaled
    to 28x28; real data, works offline) or synthetic (generated class prototypes plus noise)."""
    data_dir: Path = Path("data")
    """Where mnist lives or is downloaded to (by local rank 0 only)."""
    epochs: int = 5
    batch_size: int = 32
    """Per-rank batch size; the global batch is batch_size * world size."""
    base_lr: float = 0.01
    """Learning rate for one rank; scaled by the world size (linear scaling rule) after warm-up."""
    momentum: float = 0.9
    warmup_epochs: float = 1.0
    """Epochs over which the learning rate rises linearly from base_lr to base_lr * world size."""
    seed: int = 42
    threads: int = 1
    """The framework's intra-op threads per rank; 1 keeps N ranks from oversubscribing a CPU host."""
    fp16_allreduce: bool = False
    use_adasum: bool = False
    metrics_file: Path | None = None
    """One JSON object per epoch is appended here by rank 0."""
    summary_file: Path | None = None
    """At the end rank 0 writes one JSON object: final metrics and, per rank, host and parameter digest."""
    checkpoint_dir: Path | None = None
    resume: bool = False
    run_dir: Path | None = None
    """One run's folder: metrics, summary, checkpoints, TensorBoard events and curves.png default to it."""
    tensorboard_dir: Path | None = None
    """Rank 0 writes TensorBoard scalars here, per logging step and per epoch."""
    log_interval: int = 0
    """Batches between progress lines within an epoch; 0 means about four lines per epoch."""
    progress: str = "auto"
    """bar (tqdm, one per epoch), lines (plain log lines) or auto: a bar when rank 0 writes to a terminal."""
    no_cuda: bool = False
    elastic: bool = False
    """Elastic Horovod (run under `horovodrun --min-np/--max-np --host-discovery-script`): a lost worker rolls
    the others back to the last commit and training goes on at the new world size; new workers join."""
    commit_every: int = 20
    """Elastic: batches between commits (a commit copies model and optimizer state to host memory); a failure
    costs at most this many batches."""

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ConfigError(f"unknown dataset {self.dataset!r}: pass --dataset with one of {', '.join(DATASETS)}")
        _require(self.epochs >= 1, f"--epochs must be at least 1 (got {self.epochs})")
        _require(self.batch_size >= 1, f"--batch-size must be a positive integer (got {self.batch_size})")
        _require(self.base_lr > 0, f"--lr must be positive (got {self.base_lr})")
        _require(0 <= self.momentum < 1, f"--momentum must be in [0, 1) (got {self.momentum})")
        _require(self.warmup_epochs >= 0, f"--warmup-epochs must be 0 or more (got {self.warmup_epochs})")
        _require(self.threads >= 1, f"--threads must be at least 1 (got {self.threads})")
        _require(self.log_interval >= 0, f"--log-interval must be 0 or more (got {self.log_interval})")
        _require(self.commit_every >= 1, f"--commit-every must be at least 1 (got {self.commit_every})")
        _require(
            not (self.resume and self.checkpoint_dir is None),
            "--resume needs --checkpoint-dir (or --run-dir): pass the folder the interrupted run wrote to",
        )
        _require(
            self.progress in PROGRESS_MODES,
            f"--progress must be one of {', '.join(PROGRESS_MODES)} (got {self.progress!r})",
        )

    @property
    def curves_file(self) -> Path | None:
        """The training-curve picture rank 0 draws at the end, beside the metrics it is drawn from."""
        return self.metrics_file.with_name("curves.png") if self.metrics_file is not None else None


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def check_writable_dir(path: Path, flag: str) -> None:
    """Creates `path` if needed and proves a file can be written there; raises ConfigError if not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-probe-"):
            pass
    except OSError as error:
        raise ConfigError(
            f"{flag} {path} is not writable ({error.strerror}): pass a folder this user can write to"
        ) from None


def check_writable_file(path: Path, flag: str) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    check_writable_dir(parent, flag)
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{flag} {path} is not writable: pass a file this user can write to")


class _HelpAsked(Exception):
    """--help, which the trainer answers with its usage and exit status 0: options it takes."""


class _CheckingParser(argparse.ArgumentParser):
    """The trainer's parser on a machine that only checks its options: argparse's error is a ConfigError with
    argparse's own message, not usage and an exit; --help is an option like the others, printing nothing."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)

    def print_help(self, file: Any = None) -> None:
        pass

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _HelpAsked


def build_parser(parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> argparse.ArgumentParser:
    defaults = TrainConfig()
    parser = parser_class(
        prog="python -m app.train",
        description="Data-parallel MNIST-style training with Horovod. Start it under horovodrun or mpirun, "
        "e.g. 'horovodrun -np 2 -H localhost:2 --gloo python -m app.train --dataset digits'.",
    )
    parser.add_argument(
        "--dataset",
        default=defaults.dataset,
        help=f"mnist, digits (offline, real handwritten digits) or synthetic (default: {defaults.dataset})",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=defaults.data_dir,
        help="folder holding torchvision's MNIST layout (default: %(default)s)",
    )
    parser.add_argument("--epochs", type=int, default=defaults.epochs, help="default: %(default)s")
    parser.add_argument(
        "--batch-size", type=int, default=defaults.batch_size, help="per-rank batch size (default: %(default)s)"
    )
    parser.add_argument(
        "--lr",
        dest="base_lr",
        type=float,
        default=defaults.base_lr,
        help="single-rank learning rate, scaled by world size (default: %(default)s)",
    )
    parser.add_argument("--momentum", type=float, default=defaults.momentum, help="default: %(default)s")
    parser.add_argument(
        "--warmup-epochs",
        type=float,
        default=defaults.warmup_epochs,
        help="linear learning-rate warm-up length (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="default: %(default)s")
    parser.add_argument(
        "--threads", type=int, default=defaults.threads, help="compute threads per rank (default: %(default)s)"
    )
    parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16 for the allreduce")
    parser.add_argument("--use-adasum", action="store_true", help="combine gradients with Adasum instead of averaging")
    parser.add_argument("--metrics-file", type=Path, help="append one JSON line per epoch here")
    parser.add_argument(
        "--summary-file", type=Path, help="write the run's final summary (per-rank hosts and parameter digests) here"
    )
    parser.add_argument("--checkpoint-dir", type=Path, help="rank 0 saves a checkpoint here every epoch")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir")
    parser.add_argument(
        "--run-dir",
        type=Path,
        help="one run's folder: metrics.jsonl, summary.json, checkpoints/, tb/ and curves.png go "
        "there unless their own flags say otherwise",
    )
    parser.add_argument("--tensorboard-dir", type=Path, help="rank 0 writes TensorBoard scalars here")
    parser.add_argument(
        "--log-interval",
        type=int,
        default=defaults.log_interval,
        help="batches between progress lines (default: about four per epoch)",
    )
    parser.add_argument(
        "--progress",
        default=defaults.progress,
        help="bar, lines or auto: a bar when rank 0's output is a terminal; under mpirun every "
        "rank writes to Open MPI's own pty, so auto means lines there (default: %(default)s)",
    )
    parser.add_argument("--no-cuda", action="store_true", help="train on the CPU even where CUDA is available")
    parser.add_argument(
        "--elastic",
        action="store_true",
        help="elastic training: keep going when workers leave or join (start under horovodrun "
        "with --min-np/--max-np and --host-discovery-script)",
    )
    parser.add_argument(
        "--commit-every",
        type=int,
        default=defaults.commit_every,
        help="elastic: batches between state commits (default: %(default)s)",
    )
    return parser


def _laid_out(values: dict[str, Any]) -> dict[str, Any]:
    """The parsed values with --run-dir's layout (RUN_DIR_LAYOUT) for each setting not given by its own flag."""
    if values["run_dir"] is not None:
        for key, name in RUN_DIR_LAYOUT.items():
            if values[key] is None:
                values[key] = values["run_dir"] / name
    return values


def option_names() -> list[str]:
    """Every option the trainer takes, as its users write them (--epochs, --lr, ...)."""
    return [name for action in build_parser()._actions for name in action.option_strings]


def check_options(argv: Sequence[str]) -> list[str]:
    """The trainer's options checked as parse_config checks them, less what depends on the machine that runs it (its
    folders, its packages): for the launcher, which starts the trainer elsewhere and has no torch. Returns the words
    the trainer has no use for (an option it lacks, a stray word), which parse_config would refuse; raises
    ConfigError for a malformed value (argparse's message, e.g. `argument --epochs: invalid int value: 'x'`) or one
    a rule refuses (TrainConfig's)."""
    try:
        values, unknown = build_parser(_CheckingParser).parse_known_args(list(argv))
    except _HelpAsked:
        return []
    if unknown:
        return unknown
    TrainConfig(**_laid_out(vars(values)))
    return []


def laid_out_paths(argv: Sequence[str]) -> dict[str, Path | None]:
    """Where the trainer's options (`argv`) put its run: run_dir and each file or folder of RUN_DIR_LAYOUT, by its own
    flag or --run-dir's layout (None: neither). For a launch method, which lays a run out without running the trainer
    (and without torch); options the trainer would refuse name nothing here (check_options refuses them)."""
    try:
        values, _ = build_parser(_CheckingParser).parse_known_args(list(argv))
    except (ConfigError, _HelpAsked):
        return dict.fromkeys(("run_dir", *RUN_DIR_LAYOUT))
    laid_out = _laid_out(vars(values))
    return {key: laid_out[key] for key in ("run_dir", *RUN_DIR_LAYOUT)}


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Parses and validates; raises ConfigError (argparse's own errors still exit with status 2)."""
    values = vars(build_parser().parse_args(argv))
    if values["run_dir"] is not None:
        check_writable_dir(values["run_dir"], "--run-dir")
    config = TrainConfig(**_laid_out(values))
    for flag, folder in (("--checkpoint-dir", config.checkpoint_dir), ("--tensorboard-dir", config.tensorboard_dir)):
        if folder is not None:
            check_writable_dir(folder, flag)
    if config.tensorboard_dir is not None and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("--tensorboard-dir (and --run-dir) need the tensorboard package: pip install tensorboard")
    for flag, path in (("--metrics-file", config.metrics_file), ("--summary-file", config.summary_file)):
        if path is not None:
            check_writable_file(path, flag)
    return config
