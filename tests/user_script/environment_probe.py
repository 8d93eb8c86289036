"""A user's script that checks the environment every rank gets: the `--env` values named PREFIX_0 .. PREFIX_{N-1}
(each PREFIX_i is `value i` with a quote and a space in it) and a secret setting, whose digest it prints, never the
value. It prints what it found before Horovod starts (a rank without the job's secret is refused by the rendezvous),
then joins the others in one allreduce and exits 1 if anything was missing.

    python environment_probe.py PREFIX N SECRET_NAME
"""

import argparse
import hashlib
import os
import socket
import sys


def expected_value(index: int) -> str:
    return f'value {index} it\'s "quoted"'


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("prefix")
    parser.add_argument("count", type=int)
    parser.add_argument("secret")
    args = parser.parse_args()
    right = sum(os.environ.get(f"{args.prefix}_{i}") == expected_value(i) for i in range(args.count))
    digest = hashlib.sha256(os.environ.get(args.secret, "").encode()).hexdigest()
    rank = os.environ.get("HOROVOD_RANK", "?")
    print(
        f"environment of rank {rank} on {socket.gethostname()}: {right} of {args.count} --env values right; "
        f"{args.secret} sha256 {digest}",
        flush=True,
    )
    import horovod.torch as hvd
    import torch

    hvd.init()
    hvd.allreduce(torch.tensor([1.0]), name="probe")
    hvd.shutdown()
    return 0 if right == args.count and args.secret in os.environ else 1


if __name__ == "__main__":
    sys.exit(main())
