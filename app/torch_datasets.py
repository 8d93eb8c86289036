"""The PyTorch trainer's datasets as torch Dataset objects, each as a (train, validation) pair of 1x28x28 images.

- mnist: torchvision's MNIST under --data-dir (training and test splits). Only local rank 0 on each host
  may download it; the other ranks wait and then read the same files (see `prepare_mnist`).
- digits and synthetic: app.datasets' arrays (the same for both frameworks' trainers) as tensors.
"""

from __future__ import annotations

import socket
from pathlib import Path

import torch
from torch.utils.data import Dataset, TensorDataset

from app import datasets
from app.datasets import DOWNLOAD_TIMEOUT_S, MNIST_MEAN, MNIST_STD


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


def load_mnist(data_dir: Path) -> tuple[Dataset, Dataset]:
    from torchvision import datasets, transforms

    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((MNIST_MEAN,), (MNIST_STD,))])
    train = datasets.MNIST(str(data_dir), train=True, download=False, transform=transform)
    val = datasets.MNIST(str(data_dir), train=False, download=False, transform=transform)
    return train, val


def tensors(arrays: tuple[datasets.Arrays, datasets.Arrays]) -> tuple[Dataset, Dataset]:
    """app.datasets' (train, val) arrays as torch datasets."""
    return tuple(TensorDataset(torch.from_numpy(images), torch.from_numpy(labels)) for images, labels in arrays)  # type: ignore[return-value]


def load_dataset(name: str, data_dir: Path, seed: int) -> tuple[Dataset, Dataset]:
    if name == "mnist":
        return load_mnist(data_dir)
    if name == "digits":
        return tensors(datasets.digits(seed))
    if name == "synthetic":
        return tensors(datasets.synthetic(seed))
    raise ValueError(f"unknown dataset {name!r}")
