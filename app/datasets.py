"""The trainers' data as NumPy arrays, the same for both frameworks: images (N, 1, 28, 28) float32, normalised with
MNIST's mean and deviation, and labels (N,) int64, split into training and validation halves; and each rank's
share of an epoch.

- digits: scikit-learn's 1,797 real 8x8 handwritten digits, upscaled to 28x28 (bilinear, as torch's
  `interpolate(..., align_corners=False)`) and split 80/20 with a fixed seed, so every rank sees the same split.
- synthetic: one random prototype image per class plus noise; learnable, instant, no files.
- mnist (the TensorFlow trainer's; PyTorch's reads it through torchvision, app/torch_datasets.py): the four IDX
  files in torchvision's layout under --data-dir (DATA_DIR/MNIST/raw), downloaded from torchvision's mirror when
  absent, so one shared folder serves both images.
"""

from __future__ import annotations

import gzip
import urllib.request
from pathlib import Path

import numpy as np

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
DOWNLOAD_TIMEOUT_S = 30
MNIST_MIRROR = "https://ossci-datasets.s3.amazonaws.com/mnist/"
"""torchvision's own first mirror for MNIST."""
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
Arrays = tuple[np.ndarray, np.ndarray]
"""(images, labels)."""


def resize_bilinear(images: np.ndarray, size: int) -> np.ndarray:
    """(N, H, W) -> (N, size, size), half-pixel centres, edges clamped (torch's bilinear, align_corners=False)."""

    def axis(in_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        source = np.maximum((np.arange(size) + 0.5) * (in_size / size) - 0.5, 0.0)
        low = np.floor(source).astype(int)
        return low, np.minimum(low + 1, in_size - 1), (source - low).astype(np.float32)

    (y0, y1, wy), (x0, x1, wx) = axis(images.shape[1]), axis(images.shape[2])
    top = images[:, y0][:, :, x0] * (1 - wx) + images[:, y0][:, :, x1] * wx
    bottom = images[:, y1][:, :, x0] * (1 - wx) + images[:, y1][:, :, x1] * wx
    return (top * (1 - wy)[:, None] + bottom * wy[:, None]).astype(np.float32)


def normalise(images: np.ndarray) -> np.ndarray:
    """Pixels in [0, 1] as (N, 1, 28, 28), shifted and scaled by MNIST's mean and deviation."""
    return ((images[:, None] - MNIST_MEAN) / MNIST_STD).astype(np.float32)


def split(images: np.ndarray, labels: np.ndarray, seed: int, val_fraction: float) -> tuple[Arrays, Arrays]:
    """A seeded shuffle and split: identical on every rank, so no sample is in both halves on any rank."""
    order = np.random.default_rng(seed).permutation(len(labels))
    n_val = int(len(labels) * val_fraction)
    val_idx, train_idx = order[:n_val], order[n_val:]
    return (images[train_idx], labels[train_idx]), (images[val_idx], labels[val_idx])


def digits(seed: int, val_fraction: float = 0.2) -> tuple[Arrays, Arrays]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = resize_bilinear(bunch.images.astype(np.float32) / 16.0, 28)  # 0..16 -> 0..1
    return split(normalise(images), bunch.target.astype(np.int64), seed, val_fraction)


def synthetic(
    seed: int, size: int = 4096, val_fraction: float = 0.2, num_classes: int = 10, noise: float = 0.8
) -> tuple[Arrays, Arrays]:
    rng = np.random.default_rng(seed)
    prototypes = rng.standard_normal((num_classes, 1, 28, 28), dtype=np.float32)
    labels = rng.integers(0, num_classes, size).astype(np.int64)
    images = prototypes[labels] + noise * rng.standard_normal((size, 1, 28, 28), dtype=np.float32)
    return split(images.astype(np.float32), labels, seed, val_fraction)


def mnist_raw_dir(data_dir: Path) -> Path:
    return data_dir / "MNIST" / "raw"


def mnist_present(data_dir: Path) -> bool:
    return all((mnist_raw_dir(data_dir) / name).is_file() for names in MNIST_FILES.values() for name in names)


def download_mnist(data_dir: Path) -> str | None:
    """Fetches the missing IDX files into torchvision's layout. None on success, else why not. Local rank 0 only:
    several ranks writing one folder at once corrupt each other's files."""
    if mnist_present(data_dir):  # nothing written where it is all there (a read-only data folder)
        return None
    folder = mnist_raw_dir(data_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for names in MNIST_FILES.values():
            for name in names:
                if not (folder / name).is_file():
                    with urllib.request.urlopen(f"{MNIST_MIRROR}{name}.gz", timeout=DOWNLOAD_TIMEOUT_S) as answer:
                        data = gzip.decompress(answer.read())
                    partial = folder / f".{name}.part"
                    partial.write_bytes(data)
                    partial.replace(folder / name)
    except (OSError, EOFError) as error:  # any network or file error means the same to the user
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".strip()
    return None


def mnist_unavailable_message(data_dir: Path, reason: str) -> str:
    return (
        f"MNIST is not under --data-dir {data_dir} and could not be downloaded ({reason}); "
        f"put torchvision's MNIST folder there, or pass --dataset digits to train offline"
    )


def read_idx(path: Path) -> np.ndarray:
    """An IDX file of unsigned bytes (MNIST's format): magic 0x0000 08 NDIM, NDIM big-endian sizes, then data."""
    raw = path.read_bytes()
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    if raw[:3] != b"\x00\x00\x08" or len(raw) != 4 + 4 * dims + int(np.prod(shape)):
        raise ValueError(f"{path} is not an IDX file of bytes")
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def mnist(data_dir: Path) -> tuple[Arrays, Arrays]:
    def part(images_name: str, labels_name: str) -> Arrays:
        folder = mnist_raw_dir(data_dir)
        images = read_idx(folder / images_name).astype(np.float32) / 255.0
        return normalise(images), read_idx(folder / labels_name).astype(np.int64)

    return part(*MNIST_FILES["train"]), part(*MNIST_FILES["val"])


def shard(count: int, rank: int, size: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """This rank's sample indices for one epoch, as torch's DistributedSampler deals them: a permutation seeded by
    seed + epoch (the same on every rank), padded by wrapping around to a multiple of `size`, every size-th index
    from `rank`. Every rank gets the same number of samples, hence of batches, so no rank waits alone in an
    allreduce at an epoch's end."""
    order = np.random.default_rng(seed + epoch).permutation(count) if shuffle else np.arange(count)
    padded = np.resize(order, -(-count // size) * size)
    return padded[rank::size]


def deal(order: np.ndarray, done: int, batch_size: int, rank: int, size: int) -> tuple[np.ndarray, int]:
    """One step's batch for `rank`: the next batch_size x size samples of the epoch's `order` after the `done`
    already trained on, dealt round the ranks (wrapping round that chunk where it is shorter than the world, so no
    rank gets an empty batch). Returns (this rank's indices, how many samples of `order` the step covers). Every
    rank steps until `done` reaches len(order), whatever the world size after an elastic reset."""
    chunk = order[done : done + batch_size * size]
    return np.resize(chunk, max(len(chunk), size))[rank::size], len(chunk)
