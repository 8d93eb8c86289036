"""A user's script for the smoke role's tests: an image model's input pipeline, a torch DataLoader with 2 worker
processes over batches of 64 RGB images of 224x224 (38.5 MB a batch, as float32). The workers hand each batch to
their rank through shared memory (/dev/shm), 4 batches in flight per rank (2 workers, 2 prefetched each): about 150 MB
a rank, more than Docker's default 64 MB. Each rank reads a few batches and allreduces the count.

    python image_loader.py [--batches N]
"""

import argparse

import horovod.torch as hvd
import torch
from torch.utils.data import DataLoader, Dataset

BATCH = 64


class Images(Dataset):
    def __len__(self) -> int:
        return BATCH * 16

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.zeros(3, 224, 224), index % 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=6)
    args = parser.parse_args()
    hvd.init()
    seen = 0
    for batch, (images, _) in enumerate(DataLoader(Images(), batch_size=BATCH, num_workers=2)):
        seen += images.shape[0]
        if batch + 1 == args.batches:
            break
    total = hvd.allreduce(torch.tensor([float(seen)]), op=hvd.Sum, name="images").item()
    print(
        f"loader rank {hvd.rank()}: {seen} images of {tuple(images.shape[1:])} from 2 workers, {total:.0f} on all "
        f"{hvd.size()} ranks",
        flush=True,
    )


if __name__ == "__main__":
    main()
