"""`python -m app.bench NAME [options]`: the stack's benchmarks, each writing NAME.md, NAME.json and NAME.png under
--out (default bench-out) and printing its table.

    peers              Horovod (MPI, Gloo) vs torch DDP, untuned and with the stack's defaults
    allreduce          allreduce algorithm and bus bandwidth, 4 KB to 256 MB, Horovod (MPI, Gloo) and torch (Gloo)
    ps-vs-ring         parameter server vs ring-allreduce, one network namespace and rate-limited link per rank
    links              fp16, Adasum, fusion and cycle time on tc-shaped links (2 ranks, a namespace each), per rate
    container-vs-host  the trainer on the host vs in the compose cluster
    tf-peers           Horovod vs tf.distribute.MultiWorkerMirroredStrategy (run it in the TensorFlow image)

Each takes --short: a run of seconds that only proves the bench works (what CI runs).
"""

from __future__ import annotations

import importlib
import signal
import sys

BENCHES = {
    "peers": "app.bench.peers",
    "allreduce": "app.bench.allreduce",
    "ps-vs-ring": "app.bench.ps_vs_ring",
    "links": "app.bench.links",
    "tf-peers": "app.bench.tf_peers",
    "container-vs-host": "app.bench.container_vs_host",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in BENCHES:
        print(__doc__, file=sys.stderr)
        return 2
    # A TERM ends the run through its finally blocks: ranks stopped, namespaces removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    importlib.import_module(BENCHES[argv[0]]).main(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
