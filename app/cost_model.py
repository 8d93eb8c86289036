"""The cost model of one gradient exchange over a link (bandwidth term only): a parameter server against a ring
allreduce. One home for the formula: `python -m app.bench ps-vs-ring` measures against it and `launcher doctor
--links` predicts with it. Stdlib-only, so the launcher needs no torch.

With N ranks, an M-megabyte gradient and a B Mbit/s link: the parameter server's link carries every other rank's
push and pull, 2(N-1)·M; a ring sends each rank's share round twice, 2(N-1)/N·M per link.
"""


def model_seconds(pattern: str, ranks: int, megabytes: float, link_mbit: float) -> float:
    """The cost model's step time for `pattern` ("ps" or "ring"), in seconds."""
    per_gradient = megabytes * 1e6 * 8 / (link_mbit * 1e6)
    if pattern == "ps":
        return 2 * (ranks - 1) * per_gradient
    return 2 * (ranks - 1) / ranks * per_gradient
