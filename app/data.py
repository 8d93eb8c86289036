"""Datasets the trainer can use, each as a (train, validation) pair of 1x28x28 image datasets.

- mnist: torchvision's MNIST under --data-dir (training and test splits). Only local rank 0 on each host
  may download it; the other ranks wait and then read the same files (see `prepare_mnist`).
- digits: scikit-learn's 1,797 real 8x8 handwritten digits, upscaled to 28x28 and split 80/20 with a fixed
  seed, so every rank sees the same split. It ships with scikit-learn: real data that works offline.
- synthetic: one random prototype image per class plus noise; learnable, instant, no files.
"""

from __future__ import annotations

import socket
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
DOWNLOAD_TIMEOUT_S = 30


class DatasetUnavailable(RuntimeError):
    """The asked-for dataset is neither on disk nor downloadable; the message names the fix."""


def mnist_present(data_dir: Path) -> bool:
    from torchvision import datasets

    try:
        datasets.MNIST(str(data_dir), train=True, download=False)
        datasets.MNIST(str(data_dir), train=False, download=False)
    except RuntimeError:
        return False
    return True


def prepare_mnist(data_dir: Path) -> str | None:
    """Makes sure MNIST is under data_dir, downloading it if needed. Returns None on success, else why not.

    Called on local rank 0 only: several ranks downloading into one folder at once corrupt each other's files.
    """
    from torchvision import datasets

    if mnist_present(data_dir):
        return None
    previous_timeout = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        datasets.MNIST(str(data_dir), train=True, download=True)
        datasets.MNIST(str(data_dir), train=False, download=True)
    except Exception as error:  # any network or file error means the same thing to the user
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".strip()
    finally:
        socket.setdefaulttimeout(previous_timeout)
    return None


def mnist_unavailable_message(data_dir: Path, reason: str) -> str:
    return (
        f"MNIST is not under --data-dir {data_dir} and could not be downloaded ({reason}); "
        f"put torchvision's MNIST folder there, or pass --dataset digits to train offline"
    )


def load_mnist(data_dir: Path) -> tuple[Dataset, Dataset]:
    from torchvision import datasets, transforms

    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((MNIST_MEAN,), (MNIST_STD,))])
    train = datasets.MNIST(str(data_dir), train=True, download=False, transform=transform)
    val = datasets.MNIST(str(data_dir), train=False, download=False, transform=transform)
    return train, val


def load_digits(seed: int, val_fraction: float = 0.2) -> tuple[Dataset, Dataset]:
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0  # 0..16 -> 0..1
    images = F.interpolate(images, size=(28, 28), mode="bilinear", align_corners=False)
    images = (images - MNIST_MEAN) / MNIST_STD
    labels = torch.tensor(bunch.target, dtype=torch.long)
    return _split(images, labels, seed, val_fraction)


def make_synthetic(
    seed: int, size: int = 4096, val_fraction: float = 0.2, num_classes: int = 10, noise: float = 0.8
) -> tuple[Dataset, Dataset]:
    generator = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(num_classes, 1, 28, 28, generator=generator)
    labels = torch.randint(0, num_classes, (size,), generator=generator)
    images = prototypes[labels] + noise * torch.randn(size, 1, 28, 28, generator=generator)
    return _split(images, labels, seed, val_fraction)


def _split(images: torch.Tensor, labels: torch.Tensor, seed: int, val_fraction: float) -> tuple[Dataset, Dataset]:
    """A seeded shuffle and split: identical on every rank, so no sample is in both halves on any rank."""
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_val = int(len(labels) * val_fraction)
    val_idx, train_idx = order[:n_val], order[n_val:]
    return TensorDataset(images[train_idx], labels[train_idx]), TensorDataset(images[val_idx], labels[val_idx])


def load_dataset(name: str, data_dir: Path, seed: int) -> tuple[Dataset, Dataset]:
    if name == "mnist":
        return load_mnist(data_dir)
    if name == "digits":
        return load_digits(seed)
    if name == "synthetic":
        return make_synthetic(seed)
    raise ValueError(f"unknown dataset {name!r}")
