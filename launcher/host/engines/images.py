"""The same image on every node, before any worker starts: pulled from its registry where IMAGE names one, or copied
from this machine's engine (--push-image) with one export streamed to every node that lacks it at once, so N nodes
cost about one copy, not N; the layers every one of them holds already (an earlier build's) are left out of it
(launcher/core/layers.py).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from launcher.core import layers
from launcher.host.engines import streams
from launcher.host.engines.node_engine import NodeEngine, NodeError, on_each

Say = Callable[[str], None]
CHUNKS_AHEAD = 4
"""Chunks (8 MB each) the export may run ahead of the slowest node's load."""


class Progress:
    """One line per node each time its share done passes another tenth."""

    def __init__(self, say: Say, verb: str, image: str) -> None:
        self.say, self.verb, self.image = say, verb, image
        self.shown: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, node: str, done: int, total: int) -> None:
        tenth = int(10 * done / total) if total else 0
        with self.lock:
            if tenth <= self.shown.get(node, -1):
                return
            self.shown[node] = tenth
        self.say(f"{node}: {self.verb} {self.image}: {done / 1e9:.2f} of {total / 1e9:.2f} GB")


def pull_everywhere(engines: Sequence[NodeEngine], image: str, say: Say) -> None:
    progress = Progress(say, "pulling", image)

    def pull(engine: NodeEngine) -> None:
        started = time.monotonic()
        engine.pull_image(image, lambda done, total: progress(engine.node.name, done, total))
        say(f"{engine.node.name}: pulled {image} in {time.monotonic() - started:.0f} s")

    on_each(engines, pull)


def push_everywhere(source: NodeEngine, targets: Sequence[NodeEngine], image: str, say: Say) -> None:
    """One `docker save` on this machine, each chunk handed to every target's `docker load` as it comes, without the
    layers that every target holds already."""
    total = source.image_size(image)
    feeds: dict[str, queue.Queue[bytes | None]] = {t.node.name: queue.Queue(CHUNKS_AHEAD) for t in targets}
    gave_up: set[str] = set()
    export_error: list[BaseException] = []
    exported, sent = [0], [0]
    progress = Progress(say, "pushing", image)
    names = ", ".join(feeds)
    diff_ids = source.image_layers(image)
    left_out = layers.held_layers(diff_ids, set.intersection(*on_each(targets, lambda target: target.layer_chains())))
    if left_out:
        say(
            f"{names}: {len(left_out)} of the {len(set(diff_ids))} layers of {image} there already (an earlier "
            "build's); pushing the others"
        )

    def saved() -> Iterator[bytes]:
        for chunk in source.save_image(image):
            exported[0] += len(chunk)
            progress(names, exported[0], total)
            yield chunk

    def hand(name: str, chunk: bytes | None) -> None:
        while name not in gave_up:
            try:
                feeds[name].put(chunk, timeout=1)
                return
            except queue.Full:
                continue

    def export() -> None:
        try:
            for chunk in streams.without_files(saved(), layers.layer_files(left_out)):
                if len(gave_up) == len(feeds):
                    return
                sent[0] += len(chunk)
                for name in feeds:
                    hand(name, chunk)
        except Exception as error:  # noqa: BLE001  reported once the loads have ended
            export_error.append(error)
        finally:
            for name in feeds:
                hand(name, None)

    def load(target: NodeEngine) -> None:
        name, started = target.node.name, time.monotonic()

        def chunks() -> Iterator[bytes]:
            while (chunk := feeds[name].get()) is not None:
                yield chunk

        try:
            target.load_image(chunks(), image)
        except NodeError:
            gave_up.add(name)  # the export goes on for the others
            raise
        say(f"{name}: image loaded, {sent[0] / 1e9:.2f} GB in {time.monotonic() - started:.0f} s")

    exporter = threading.Thread(target=export, name="image-export", daemon=True)
    exporter.start()
    try:
        on_each(targets, load)
    finally:
        gave_up.update(feeds)
        exporter.join()
    if export_error:
        raise NodeError(source.node.name, f"exporting {image} failed ({export_error[0]}); check its Docker engine")
