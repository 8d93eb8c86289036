"""Byte streams from the engines (a run folder's archive, a job's log) read as they arrive, never whole in memory:
a file over an iterator of chunks, the first file of an archive's stream, an archive's stream without some of its
files, a stream's tail, and one decoded as text for a terminal.
"""

from __future__ import annotations

import codecs
import io
import tarfile
from collections import deque
from collections.abc import Iterable, Iterator
from typing import IO

BLOCK = 64 * 1024


class ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks (docker-py's streams), for tarfile's stream mode."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def reader(chunks: Iterable[bytes]) -> io.BufferedReader:
    return io.BufferedReader(ChunkReader(chunks), BLOCK)


def file_in_archive(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The first file of a tar stream (get_archive's of one file), block by block; nothing for a broken archive."""
    try:
        with tarfile.open(fileobj=reader(chunks), mode="r|") as archive:
            member = archive.next()
            content = archive.extractfile(member) if member else None
            while content is not None and (block := content.read(BLOCK)):
                yield block
    except tarfile.TarError:
        return


def without_files(chunks: Iterable[bytes], left_out: set[str], chunk_size: int = 8 * 1024 * 1024) -> Iterator[bytes]:
    """A tar stream without the files named in `left_out`, as chunks while it arrives (an image's export without the
    layers a node holds: launcher/core/layers.py). With nothing to leave out, the chunks as they come."""
    if not left_out:
        yield from chunks
        return
    with tarfile.open(fileobj=reader(chunks), mode="r|") as archive:
        for member in archive:
            if member.name in left_out:
                continue  # stream mode skips its data
            yield member.tobuf(tarfile.PAX_FORMAT)
            content = archive.extractfile(member) if member.isfile() else None
            if content is None:
                continue
            while block := content.read(chunk_size):
                yield block
            if member.size % tarfile.BLOCKSIZE:
                yield b"\0" * (tarfile.BLOCKSIZE - member.size % tarfile.BLOCKSIZE)
    yield b"\0" * (2 * tarfile.BLOCKSIZE)  # the end of the archive


def tail_lines(chunks: Iterable[bytes], count: int) -> bytes:
    """The last `count` lines of the stream (a last line without a newline counts)."""
    lines: deque[bytes] = deque(maxlen=max(count, 0))
    pending = b""
    for chunk in chunks:
        pending += chunk
        *whole, pending = pending.split(b"\n")
        lines.extend(line + b"\n" for line in whole)
    if pending and count > 0:
        lines.append(pending)
    return b"".join(lines)


def write_decoded(chunks: Iterable[bytes], out: IO[str]) -> None:
    """The stream to `out` as it arrives (decoded), each piece flushed: a followed job's lines show as they come."""
    for text in decoded(chunks):
        out.write(text)
        out.flush()


def decoded(chunks: Iterable[bytes]) -> Iterator[str]:
    """The stream as UTF-8 text, piece by piece as it arrives: a character split between two chunks is still one
    character, and bytes that are not UTF-8 become U+FFFD rather than an error."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in chunks:
        yield decoder.decode(chunk)
    yield decoder.decode(b"", final=True)
