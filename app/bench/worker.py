"""The rank side of the multi-rank benches: `python -m app.bench.worker BENCH --peer PEER --result FILE ...`.

Started on every rank by app.bench.ranks.run_job (or a bench's own driver, as tf-peers'); runs BENCH's
`rank_main(argv)`.
"""

from __future__ import annotations

import importlib
import sys

RANK_SIDES = {
    "peers": "app.bench.peers",
    "allreduce": "app.bench.allreduce",
    "ps-vs-ring": "app.bench.ps_vs_ring",
    "links": "app.bench.links",
    "tf-peers": "app.bench.tf_peers",
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    importlib.import_module(RANK_SIDES[argv[0]]).rank_main(argv[1:])


if __name__ == "__main__":
    main()
