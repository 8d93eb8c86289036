"""Which of an image's layers a node already holds, and an image archive without them.

An image is a stack of layers, each named by the digest of its contents (its diff ID); a layer in a stack is named
by its chain ID, the digest of its diff ID and every one beneath it, so a node holds a layer of the stack only if it
holds the same layers under it too. A new build of an image usually changes only its top layers (the code, not
CUDA or the framework), so `--push-image` sends a node only the layers it lacks: `docker save` writes every layer
as `blobs/sha256/<diff ID>` (the OCI layout, Docker 25 and newer), and `docker load` takes an archive without the
layers the engine already has. An archive in another layout is sent whole.
"""

from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Iterable, Iterator

LAYER_PREFIX = "blobs/sha256/"
BLOCK = tarfile.BLOCKSIZE


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


class _Reader:
    """Chunks as a file that tarfile's stream mode reads (a read copies only what it returns)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks, self.chunk, self.offset = iter(chunks), b"", 0

    def read(self, size: int = -1) -> bytes:
        parts: list[bytes] = []
        while size != 0:
            if self.offset >= len(self.chunk):
                self.chunk, self.offset = next(self.chunks, b""), 0
                if not self.chunk:
                    break
            end = len(self.chunk) if size < 0 else min(len(self.chunk), self.offset + size)
            parts.append(self.chunk[self.offset : end])
            size -= (end - self.offset) if size > 0 else 0
            self.offset = end
        return b"".join(parts)


def without_layers(chunks: Iterable[bytes], left_out: set[str], chunk_size: int = 8 * 1024 * 1024) -> Iterator[bytes]:
    """The archive `docker save` streams, without the files of the layers in `left_out` (diff IDs), as chunks.
    With nothing to leave out, the chunks as they come."""
    if not left_out:
        yield from chunks
        return
    skipped = {LAYER_PREFIX + diff_id.removeprefix("sha256:") for diff_id in left_out}
    with tarfile.open(fileobj=_Reader(chunks), mode="r|") as archive:  # type: ignore[call-overload]
        for member in archive:
            if member.name in skipped:
                continue  # stream mode skips its data
            yield member.tobuf(tarfile.PAX_FORMAT)
            if not member.isfile():
                continue
            data = archive.extractfile(member)
            assert data is not None
            while block := data.read(chunk_size):
                yield block
            if member.size % BLOCK:
                yield b"\0" * (BLOCK - member.size % BLOCK)
    yield b"\0" * (2 * BLOCK)  # the end of the archive
