"""A user's script that checks the environment every rank gets: the `--env` values named PREFIX_0 .. PREFIX_{N-1}
(each PREFIX_i is `value i` with a quote and a space in it) and a secret setting, whose digest it prints, never the
value, and how many zombie processes ssh has in its container (horovodrun's ssh to the other nodes runs in rank 0's).
It prints what it found before Horovod starts (a rank without the job's secret is refused by the rendezvous), then
joins the others in one allreduce and exits 1 if anything was missing.

    python environment_probe.py PREFIX N SECRET_NAME
"""

import argparse
import hashlib
import os
import socket
import sys
from pathlib import Path


def expected_value(index: int) -> str:
    return f'value {index} it\'s "quoted"'


def zombies_of_ssh() -> int:
    """Processes that ended and that a process named ssh has not reaped."""
    count = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, parent = stat.read_text().rsplit(")", 1)[1].split()[:2]
            count += state == "Z" and Path(f"/proc/{parent}/comm").read_text().strip() == "ssh"
        except (OSError, IndexError):  # it ended meanwhile
            pass
    return count


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
        f"{args.secret} sha256 {digest}; zombies of ssh {zombies_of_ssh()}",
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
