"""The image on every node: registry names, one export fanned out to every node, pull errors in one line (stand-in
engines; the real ones: test_launcher_multihost.py)."""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
import threading

import pytest

from launcher.core import layers
from launcher.core.imageref import parse_image
from launcher.core.options import SettingsError
from launcher.host.engines import images, streams
from launcher.host.engines.node_engine import NodeError, pull_failure
from launcher.host.planning.settings import resolve_settings
from launcher.host.running import nodechecks
from tests.conftest import launch_settings
from tests.standins import StandInEngine as Engine

DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "image, registry, path, tag, digest, source",
    [
        ("horovod-stack:latest", None, "horovod-stack", "latest", None, None),  # this machine's build: never pulled
        ("horovod-stack", None, "horovod-stack", None, None, None),
        ("team/horovod-stack:1", None, "team/horovod-stack", "1", None, "Docker Hub"),  # a Docker Hub namespace
        (f"horovod-stack@{DIGEST}", None, "horovod-stack", None, DIGEST, "Docker Hub"),
        (f"team/horovod-stack:1@{DIGEST}", None, "team/horovod-stack", "1", DIGEST, "Docker Hub"),
        (
            "registry.example:5000/horovod-stack:1",
            "registry.example:5000",
            "horovod-stack",
            "1",
            None,
            "registry.example:5000",
        ),
        ("10.213.7.1:5000/horovod-stack", "10.213.7.1:5000", "horovod-stack", None, None, "10.213.7.1:5000"),
        ("localhost/horovod-stack:1", "localhost", "horovod-stack", "1", None, "localhost"),
        (f"ghcr.io/team/sub/horovod-stack@{DIGEST}", "ghcr.io", "team/sub/horovod-stack", None, DIGEST, "ghcr.io"),
    ],
)
def test_an_image_reference_says_where_a_node_gets_it(image, registry, path, tag, digest, source):
    reference = parse_image(image)
    assert (reference.registry, reference.path, reference.tag, reference.digest) == (registry, path, tag, digest)
    assert (reference.source if reference.pulled else None) == source


@pytest.mark.parametrize(
    "image, words",
    [
        ("Registry/UPPER:tag", "'UPPER' is not a lowercase name part"),
        ("Horovod-Stack:latest", "'Horovod-Stack' is not a lowercase name part"),
        ("horovod-stack:", "its tag '' is not"),
        ("horovod-stack:a/b", "'horovod-stack:a' is not a registry host[:port]"),
        ("horovod-stack@sha256:xyz", "its digest 'sha256:xyz' is not ALGORITHM:HEX"),
        ("team//img", "'' is not a lowercase name part"),
        ("", "'' is not a lowercase name part"),
    ],
)
def test_a_reference_docker_refuses_is_named_with_its_fault(image, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        parse_image(image)


def test_a_bad_image_setting_stops_before_any_node_is_contacted():
    with pytest.raises(
        SettingsError, match=re.escape("image 'Team/Img:1' (--image, IMAGE in .env) is not an image name")
    ):
        resolve_settings({"IMAGE": "Team/Img:1"}, nodes="node_1")


CHUNKS = [bytes([n]) * 1000 for n in range(40)]  # more than CHUNKS_AHEAD: the loads must keep up


def test_one_export_reaches_every_node_at_once():
    source, targets = Engine("this machine", chunks=CHUNKS), [Engine("node_2"), Engine("node_3"), Engine("node_4")]
    said: list[str] = []
    images.push_everywhere(source, targets, "img:1", said.append)
    assert source.saves == 1
    assert all(target.loaded == CHUNKS for target in targets)
    assert any(line.startswith("node_2, node_3, node_4: pushing img:1:") for line in said)
    assert sum("image loaded" in line for line in said) == 3


def test_a_node_that_fails_its_load_does_not_stop_the_others():
    targets = [Engine("node_2"), Engine("node_3", fail_after=3)]
    before = set(threading.enumerate())  # other tests' threads (a TLS front, a reader) are not this one's
    with pytest.raises(NodeError, match="node_3: copying img:1 failed"):
        images.push_everywhere(Engine("this machine", chunks=CHUNKS), targets, "img:1", lambda _: None)
    assert targets[0].loaded == CHUNKS
    assert set(threading.enumerate()) <= before  # the export thread and the loads ended too


def test_pulls_run_on_every_node_and_a_missing_tag_is_one_line():
    said: list[str] = []
    targets = [Engine("node_1"), Engine("node_2")]
    images.pull_everywhere(targets, "registry.example:5000/img:1", said.append)
    assert [target.pulled for target in targets] == [["registry.example:5000/img:1"]] * 2
    assert "node_2: pulling registry.example:5000/img:1: 0.00 of 0.00 GB" in said
    with pytest.raises(NodeError) as refused:
        images.pull_everywhere(targets, "registry.example:5000/missing:1", lambda _: None)
    assert str(refused.value) == (
        "node_1: pulling registry.example:5000/missing:1 failed (manifest unknown); check "
        "the name and tag, or push the image there first (docker push "
        "registry.example:5000/missing:1)"
    )


def test_only_the_nodes_that_lack_a_registry_image_pull_it():
    hosts = {"node_1": "10.0.0.1", "node_2": "10.0.0.2"}  # both names resolve on both nodes
    has, lacks = Engine("node_1", resolves=hosts), Engine("node_2", image=None, resolves=hosts)
    said: list[str] = []
    settings = launch_settings(nodes=("node_1", "node_2"), image="registry.example:5000/img:1")
    nodechecks.check_nodes(settings, [has, lacks], say=said.append)
    assert (has.pulled, lacks.pulled) == ([], ["registry.example:5000/img:1"])
    assert [line for line in said if " pulled " in line] == ["node_2: pulled registry.example:5000/img:1 in 0 s"]
    assert "image registry.example:5000/img:1 (0123456789ab) is the same on all 2 nodes" in said


@pytest.mark.parametrize(
    "why, fix",
    [
        (
            'Get "https://reg.example:5000/v2/": dial tcp: lookup reg.example: no such host',
            "check that reg.example:5000 resolves and answers from node_2",
        ),
        ("unauthorized: authentication required", "run `docker login reg.example:5000` on this machine"),
        ("manifest for reg.example:5000/img:9 not found: manifest unknown", "check the name and tag"),
        ("something else", "pull it there by hand to see more"),
    ],
)
def test_pull_failures_name_the_fix(why, fix):
    assert fix in pull_failure("node_2", "reg.example:5000/img:9", why)


def image_archive(files: dict[str, bytes]) -> bytes:
    """An archive laid out as `docker save` writes one (blobs/sha256/<digest>, then its index)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


BASE, CUDA, CODE = "sha256:" + "a" * 64, "sha256:" + "b" * 64, "sha256:" + "c" * 64
ARCHIVE = {
    f"blobs/sha256/{'a' * 64}": b"base layer " * 300,
    f"blobs/sha256/{'b' * 64}": b"cuda layer " * 500,
    f"blobs/sha256/{'c' * 64}": b"new code",
    "manifest.json": b'[{"Layers": ["..."]}]',
}


def test_chain_ids_name_a_layer_by_everything_beneath_it():
    first, second, third = layers.chain_ids([BASE, CUDA, CODE])
    assert first == BASE  # the bottom layer's chain ID is its diff ID (the image spec's ChainID)
    assert second == "sha256:" + hashlib.sha256(f"{BASE} {CUDA}".encode()).hexdigest()
    assert third == "sha256:" + hashlib.sha256(f"{second} {CODE}".encode()).hexdigest()
    assert layers.chain_ids([CUDA, CODE])[1] != third  # the same layer on another base is another layer


@pytest.mark.parametrize(
    "images_held, left_out",
    [
        ([], set()),
        ([[BASE]], {BASE}),
        ([[BASE, CUDA]], {BASE, CUDA}),
        ([[BASE, CUDA, CODE]], {BASE, CUDA, CODE}),
        ([[CUDA]], set()),  # the CUDA layer as another image's bottom: not on this stack's base
        ([[CODE], [BASE]], {BASE}),  # the top layer in an image of its own is not this stack's top layer
    ],
)
def test_only_layers_held_with_everything_beneath_them_are_left_out(images_held, left_out):
    held_chains = {chain for stack in images_held for chain in layers.chain_ids(stack)}
    assert layers.held_layers([BASE, CUDA, CODE], held_chains) == left_out


def test_a_layer_that_occurs_twice_is_left_out_only_if_held_both_times():
    stack = [BASE, CUDA, BASE]
    assert layers.held_layers(stack, set(layers.chain_ids(stack[:2]))) == {CUDA}
    assert layers.held_layers(stack, set(layers.chain_ids(stack))) == {BASE, CUDA}


def members(chunks) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as archive:
        return {m.name: archive.extractfile(m).read() for m in archive}  # type: ignore[union-attr]


@pytest.mark.parametrize("chunk_size", [7, 512, 4096, 10**6])
def test_the_archive_without_held_layers_keeps_every_other_file_whole(chunk_size):
    whole = image_archive(ARCHIVE)
    chunks = [whole[i : i + chunk_size] for i in range(0, len(whole), chunk_size)]
    kept = members(streams.without_files(chunks, layers.layer_files({BASE, CUDA})))
    assert kept == {name: data for name, data in ARCHIVE.items() if "a" * 64 not in name and "b" * 64 not in name}
    assert members(streams.without_files(chunks, set())) == ARCHIVE
    assert list(streams.without_files(chunks, set())) == chunks  # nothing to leave out: the export as it comes


def test_a_push_leaves_out_the_layers_every_node_holds_and_sends_the_rest():
    whole = image_archive(ARCHIVE)
    chunks = [whole[i : i + 1000] for i in range(0, len(whole), 1000)]
    source = Engine("this machine", chunks=chunks, layers=(BASE, CUDA, CODE))
    both = frozenset(layers.chain_ids([BASE, CUDA]))  # an earlier build: the same base and CUDA, older code
    targets = [Engine("node_1", chains=both), Engine("node_2", chains=both | {"sha256:" + "d" * 64})]
    said: list[str] = []
    images.push_everywhere(source, targets, "img:2", said.append)
    assert "node_1, node_2: 2 of the 3 layers of img:2 there already (an earlier build's); pushing the others" in said
    assert [set(members(target.loaded)) for target in targets] == [{f"blobs/sha256/{'c' * 64}", "manifest.json"}] * 2
    only_base = Engine("node_3", chains=frozenset(layers.chain_ids([BASE])))  # each node gets what all of them lack
    images.push_everywhere(Engine("this machine", chunks=chunks, layers=(BASE, CUDA, CODE)), [targets[0], only_base],
                           "img:2", said.append)  # fmt: skip
    assert set(members(only_base.loaded)) == {f"blobs/sha256/{'b' * 64}", f"blobs/sha256/{'c' * 64}", "manifest.json"}
