"""A user's Horovod script that hangs, as real jobs do: rank 1 blocks in a function of its own (a dataset read that
never returns) while the other ranks wait for it in an allreduce.

    python stall.py [--seconds N]
"""

import argparse
import time

import horovod.torch as hvd
import torch


def wait_for_data(seconds: float) -> None:
    time.sleep(seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3600)
    args = parser.parse_args()
    hvd.init()
    print(f"stall-script rank {hvd.rank()} of {hvd.size()} started", flush=True)
    if hvd.rank() == 1:
        wait_for_data(args.seconds)
    hvd.allreduce(torch.ones(1), name="after_the_wait")
    print(f"stall-script rank {hvd.rank()} done", flush=True)


if __name__ == "__main__":
    main()
