"""A user's script that needs a secret setting (an experiment tracker's API key): each rank prints a digest of the
value it got, never the value, then waits a little so a test can look at every process meanwhile.

    python secret_digest.py NAME [--hold SECONDS]
"""

import argparse
import hashlib
import os
import time

import horovod.torch as hvd


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--hold", type=float, default=15)
    args = parser.parse_args()
    hvd.init()
    digest = hashlib.sha256(os.environ.get(args.name, "").encode()).hexdigest()
    print(f"secret rank {hvd.rank()} of {hvd.size()}: {args.name} sha256 {digest}", flush=True)
    time.sleep(args.hold)
    hvd.shutdown()


if __name__ == "__main__":
    main()
