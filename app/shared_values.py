"""Small values every rank hands every other (parameter digests, hosts, the resume epoch, a bench's timings), as JSON
in fixed-size byte tensors: no pickle crosses a collective.

Horovod's `allgather_object` and `broadcast_object` (and torch's `all_gather_object`) unpickle what the other ranks
send, and the Gloo and Open MPI links under them authenticate nothing: bytes from a stranger who got into the job's
network would run as code. JSON decodes to data only. Every backend supplies one primitive, the allgather of a 1-D
array of the same length on every rank (ALLGATHER); the values' differing lengths are gathered first, then each
rank's bytes padded to the longest.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

Allgather = Callable[[np.ndarray, str], np.ndarray]
"""(this rank's 1-D array, a collective name) -> every rank's array concatenated in rank order; same length on all."""


def encode(value: Any) -> np.ndarray:
    """The value as JSON's UTF-8 bytes (tuples become lists)."""
    return np.frombuffer(json.dumps(value).encode(), dtype=np.uint8).copy()


def padded(data: np.ndarray, length: int) -> np.ndarray:
    block = np.zeros(length, dtype=np.uint8)
    block[: len(data)] = data
    return block


def decoded(blocks: np.ndarray, lengths: list[int]) -> list[Any]:
    """Every rank's value from the gathered blocks (one row a rank, padded) and their lengths."""
    return [json.loads(bytes(row[:length]).decode()) for row, length in zip(blocks, lengths, strict=True)]


def allgather(value: Any, gather: Allgather, name: str) -> list[Any]:
    """Every rank's value, in rank order, on every rank."""
    data = encode(value)
    lengths = [int(length) for length in gather(np.array([len(data)], dtype=np.int64), f"{name}.lengths")]
    longest = max(lengths)
    blocks = gather(padded(data, longest), name).reshape(len(lengths), longest)
    return decoded(blocks, lengths)


def broadcast(value: Any, root_rank: int, gather: Allgather, name: str) -> Any:
    """The root rank's value, on every rank (the others' values are gathered too, and dropped: a few bytes)."""
    return allgather(value, gather, name)[root_rank]
