"""A synthetic training benchmark for Horovod with PyTorch, written as a user's script would be: random images and
labels, a torchvision model, Horovod's DistributedOptimizer, the model and the optimizer's state sent from rank 0 to
every rank before the first step. Each rank prints its images per second; rank 0 then prints their sum.

    horovodrun -np 2 python synthetic_benchmark.py --no-cuda --model mobilenet_v3_small --batch-size 4

The smoke role's tests (tests/test_smoke.py) and this repository's CI run it on CPUs through the image's smoke role.
"""

from __future__ import annotations

import argparse
import statistics
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torchvision import models

CLASSES = 1000
IMAGE_SHAPE = (3, 224, 224)


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Images per second of a torchvision model trained by Horovod on "
                                     "random data.")  # fmt: skip
    parser.add_argument("--model", default="resnet50", help="a torchvision model's name (default: resnet50)")
    parser.add_argument("--batch-size", type=int, default=32, help="images a rank takes per step (default: 32)")
    parser.add_argument("--num-warmup-batches", type=int, default=10, help="untimed steps first (default: 10)")
    parser.add_argument("--num-batches-per-iter", type=int, default=10, help="steps per timed round (default: 10)")
    parser.add_argument("--num-iters", type=int, default=10, help="timed rounds (default: 10)")
    parser.add_argument("--fp16-allreduce", action="store_true", help="send the gradients as float16")
    parser.add_argument("--no-cuda", action="store_true", help="train on the CPU even where there is a GPU")
    return parser.parse_args()


def main() -> None:
    args = options()
    hvd.init()
    on_gpu = torch.cuda.is_available() and not args.no_cuda
    if on_gpu:
        torch.cuda.set_device(hvd.local_rank())
    device = torch.device("cuda", hvd.local_rank()) if on_gpu else torch.device("cpu")
    kind = "GPU" if on_gpu else "CPU"

    model = models.get_model(args.model, num_classes=CLASSES).to(device)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9),
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    images = torch.rand(args.batch_size, *IMAGE_SHAPE, device=device)
    labels = torch.randint(CLASSES, (args.batch_size,), device=device)

    def steps(count: int) -> float:
        """Trains `count` steps on the same batch; the seconds they took."""
        started = time.perf_counter()
        for _ in range(count):
            optimizer.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
        if on_gpu:
            torch.cuda.synchronize()
        return time.perf_counter() - started

    rank = hvd.rank()
    print(f"rank {rank}: {args.model}, batch {args.batch_size}, {hvd.size()} {kind} ranks", flush=True)
    steps(args.num_warmup_batches)
    rates = []
    for round_ in range(args.num_iters):
        rates.append(args.batch_size * args.num_batches_per_iter / steps(args.num_batches_per_iter))
        print(f"rank {rank}: round {round_ + 1} of {args.num_iters}: {rates[-1]:.1f} img/sec", flush=True)
    mean = statistics.fmean(rates)
    spread = statistics.stdev(rates) if len(rates) > 1 else 0.0
    print(f"rank {rank}: {mean:.1f} img/sec (+-{spread:.1f} over {len(rates)} rounds)", flush=True)
    total = hvd.allreduce(torch.tensor(mean), op=hvd.Sum, name="images_per_second").item()
    if rank == 0:
        print(f"total: {total:.1f} img/sec on {hvd.size()} {kind} ranks", flush=True)


if __name__ == "__main__":
    main()
