"""Checks that every rank ends with the same model: a digest of the parameters per rank, compared."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np


def digest_arrays(named: Iterable[tuple[str, np.ndarray]]) -> str:
    """SHA-256 over each name and the exact bytes of its array, in the order given."""
    digest = hashlib.sha256()
    for name, array in named:
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8).tobytes())
    return digest.hexdigest()


def ranks_differing_from_root(digests: list[str], root_rank: int = 0) -> list[int]:
    """Ranks whose digest differs from the root rank's (empty when all agree)."""
    return [rank for rank, digest in enumerate(digests) if digest != digests[root_rank]]
