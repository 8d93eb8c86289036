"""Which of an image's layers a node already holds, and where an image's archive keeps them.

An image is a stack of layers, each named by the digest of its contents (its diff ID); a layer in a stack is named
by its chain ID, the digest of its diff ID and every one beneath it, so a node holds a layer of the stack only if it
holds the same layers under it too. A new build of an image usually changes only its top layers (the code, not
CUDA or the framework), so `--push-image` sends a node only the layers it lacks: `docker save` writes every layer
as `blobs/sha256/<diff ID>` (the OCI layout, Docker 25 and newer), and `docker load` takes an archive without the
layers the engine already has (launcher/host/engines/streams.py's `without_files` leaves them out of the stream). An
archive in another layout is sent whole.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

LAYER_PREFIX = "blobs/sha256/"


def chain_ids(diff_ids: Iterable[str]) -> list[str]:
    """Each layer's chain ID, bottom first: the first layer's is its diff ID; each next one's is
    sha256("<chain ID beneath> <diff ID>")."""
    chains: list[str] = []
    for diff_id in diff_ids:
        chain = diff_id if not chains else "sha256:" + hashlib.sha256(f"{chains[-1]} {diff_id}".encode()).hexdigest()
        chains.append(chain)
    return chains


def held_layers(diff_ids: list[str], held_chains: set[str]) -> set[str]:
    """The image's layers (diff IDs) that need not be sent: held, with all beneath them, wherever each one occurs in
    the stack (one diff ID can occur twice, its file once in the archive)."""
    held: dict[str, bool] = {}
    for diff_id, chain in zip(diff_ids, chain_ids(diff_ids), strict=True):
        held[diff_id] = held.get(diff_id, True) and chain in held_chains
    return {diff_id for diff_id, is_held in held.items() if is_held}


def layer_files(diff_ids: Iterable[str]) -> set[str]:
    """Where `docker save`'s archive holds these layers (the OCI layout: blobs/sha256/<diff ID's digest>)."""
    return {LAYER_PREFIX + diff_id.removeprefix("sha256:") for diff_id in diff_ids}
