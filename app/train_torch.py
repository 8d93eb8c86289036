"""The PyTorch trainer (`python -m app.train` on horovod-stack:latest): data-parallel training of SimpleNet with
Horovod, one process per rank. The run itself is app/train_loop.py's; this module is what PyTorch does its own way.

- Data: torch datasets (app/torch_datasets.py), each rank's share dealt by torch's DistributedSampler, or with
  --elastic by Horovod's ElasticSampler, which hands out only the samples of the epoch not yet trained on,
  re-sharded over whoever is there after each reset.
- A step: SGD with momentum inside `hvd.DistributedOptimizer`, which averages the gradients over the ranks
  (`--fp16-allreduce`, `--use-adasum`).
- Checkpoints: `latest.pt`, the model's and the optimizer's state dicts (app/checkpoint.py).
- Elastic: Horovod's TorchState over model, optimizer and sampler.

Launch it under horovodrun or mpirun, e.g.
    horovodrun -np 2 -H localhost:2 --gloo python -m app.train --dataset digits
    mpirun -np 2 -bind-to none -map-by slot python -m app.train --dataset digits
    horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script ./hosts.sh python -m app.train --elastic
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sized
from functools import partial
from pathlib import Path
from typing import Any, cast

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from app import checkpoint, gpu, torch_datasets, train_loop
from app.config import TrainConfig
from app.model import SimpleNet
from app.train_loop import Batch, Reduction, Saved

REDUCTIONS = {"sum": hvd.Sum, "min": hvd.Min}


def dataset_size(dataset: Dataset) -> int:
    """How many samples a map-style dataset holds (torch's Dataset type does not say it has a length)."""
    return len(cast(Sized, dataset))


def named_arrays(model: torch.nn.Module) -> Iterable[tuple[str, np.ndarray]]:
    """Every parameter and buffer, in state_dict order, as arrays on the CPU."""
    return ((name, tensor.detach().to("cpu").numpy()) for name, tensor in model.state_dict().items())


class TorchTrainer:
    """app.train_loop.FrameworkTrainer on PyTorch."""

    hvd = hvd
    checkpoint_file = checkpoint.LATEST

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.device = torch.device("cpu")
        self.model: torch.nn.Module
        self.optimizer: torch.optim.Optimizer
        self.train_set: Dataset
        self.val_set: Dataset
        self.sampler: Any  # DistributedSampler, or ElasticSampler with --elastic
        self.train_loader: DataLoader

    def place(self) -> str:
        config = self.config
        torch.manual_seed(config.seed)
        torch.set_num_threads(config.threads)
        use_cuda = torch.cuda.is_available() and not config.no_cuda
        if use_cuda:
            torch.cuda.set_device(hvd.local_rank())
            torch.cuda.manual_seed(config.seed)
        self.device = torch.device("cuda" if use_cuda else "cpu")
        return str(self.device)

    def fetch_mnist(self) -> str | None:
        return torch_datasets.prepare_mnist(self.config.data_dir)

    def load_data(self) -> tuple[int, int]:
        config = self.config
        self.train_set, self.val_set = torch_datasets.load_dataset(config.dataset, config.data_dir, config.seed)
        return dataset_size(self.train_set), dataset_size(self.val_set)

    def build(self) -> None:
        self.model = SimpleNet().to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.config.base_lr, momentum=self.config.momentum)

    def read_checkpoint(self, directory: Path) -> Saved | None:
        state = checkpoint.load_latest_checkpoint(directory)
        return None if state is None else Saved(state["epoch"], state["dataset"], state)

    def restore(self, saved: Saved) -> str | None:
        self.model.load_state_dict(saved.content["model"])
        self.optimizer.load_state_dict(saved.content["optimizer"])
        return None

    def write_checkpoint(self, directory: Path, meta: dict[str, Any]) -> None:
        state = {**meta, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        checkpoint.save_checkpoint(directory, state)

    def broadcast_initial_state(self) -> None:
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)

    def begin(self, start_epoch: int) -> None:
        config = self.config
        self.optimizer = hvd.DistributedOptimizer(
            self.optimizer,
            named_parameters=self.model.named_parameters(),
            compression=hvd.Compression.fp16 if config.fp16_allreduce else hvd.Compression.none,
            op=hvd.Adasum if config.use_adasum else hvd.Average,
        )
        if config.elastic:
            self.sampler = hvd.elastic.ElasticSampler(self.train_set, shuffle=True, seed=config.seed)
        else:
            self.sampler = self.shard(self.train_set, shuffle=True)
        self.sampler.set_epoch(start_epoch)  # a different shuffle each epoch, the same on every rank
        self.train_loader = DataLoader(self.train_set, batch_size=config.batch_size, sampler=self.sampler)

    def shard(self, dataset: Dataset, shuffle: bool) -> DistributedSampler:
        return DistributedSampler(
            dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=shuffle, seed=self.config.seed
        )

    def progress_fields(self) -> dict[str, Any]:
        return {}  # where in the epoch training is: the sampler's, a field of the elastic State

    def elastic_state(self, **fields: Any) -> Any:
        state = hvd.elastic.TorchState(model=self.model, optimizer=self.optimizer, sampler=self.sampler, **fields)
        # Re-shards the rest of the epoch over the new world (a removal skips the state's sync).
        state.register_reset_callbacks([self.sampler.reset])
        return state

    def batches(self, epoch: int, progress: Any) -> Iterator[Batch]:
        self.model.train()
        steps = len(self.train_loader)
        for step, (images, labels) in enumerate(self.train_loader):
            if self.config.elastic:  # the samples trained on, whatever the world size was then
                done = self.sampler.processed_num / dataset_size(self.train_set)
            else:
                done = step / steps
            train = partial(self.train_step, step, images.to(self.device), labels.to(self.device))
            yield Batch(done, steps, len(labels), train)

    def train_step(self, step: int, images: torch.Tensor, labels: torch.Tensor, lr: float) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad()
        loss = F.nll_loss(self.model(images), labels)
        loss.backward()
        self.optimizer.step()
        if self.config.elastic:
            self.sampler.record_batch(step, self.config.batch_size)
        return float(loss.item())

    def next_epoch(self, progress: Any, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def evaluate(self) -> tuple[float, float, int]:
        self.model.eval()
        loader = DataLoader(
            self.val_set, batch_size=self.config.batch_size, sampler=self.shard(self.val_set, shuffle=False)
        )
        loss_sum, correct, count = 0.0, 0.0, 0
        with torch.no_grad():
            for images, labels in loader:
                images, labels = images.to(self.device), labels.to(self.device)
                output = self.model(images)
                loss_sum += F.nll_loss(output, labels, reduction="sum").item()
                correct += (output.argmax(dim=1) == labels).sum().item()
                count += len(labels)
        return loss_sum, correct, count

    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def named_arrays(self) -> Iterable[tuple[str, np.ndarray]]:
        return named_arrays(self.model)

    def allreduce(self, values: np.ndarray, op: Reduction, name: str) -> np.ndarray:
        return hvd.allreduce(torch.from_numpy(values), op=REDUCTIONS[op], name=name).numpy()

    def allgather(self, array: np.ndarray, name: str) -> np.ndarray:
        return hvd.allgather(torch.from_numpy(array), name=name).numpy()


def main(argv: list[str] | None = None) -> int:
    return train_loop.main(argv, TorchTrainer, gpu.TORCH_BUILD, torch.cuda.is_available)


if __name__ == "__main__":
    sys.exit(main())
