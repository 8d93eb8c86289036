"""scripts/build-sif.sh: the SIF of an image is made once per image ID, replaces the SIF of the image's older ID,
and a build that is interrupted leaves nothing behind; bad input is refused in one line.

The builds here are of a small image made from the Slurm node image (a label on top: a new image ID each run, no
network), in a SIF cache of the test's own, so they take seconds and touch neither the shared images nor their SIFs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurmcluster import REPO, node_image

BUILD_SIF = REPO / "scripts" / "build-sif.sh"
ENV_VALUE = "a b,c>=1 $HOME"
"""A value of the image's environment with a space, a comma, a > and a $ that must reach the SIF as it is."""


def build_sif(cache: Path, image: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [BUILD_SIF],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "IMAGE": image, "SIF_CACHE": str(cache), **env},
    )


def test_an_unknown_compressor_is_refused_in_one_line(tmp_path):
    refused = build_sif(tmp_path, "horovod-stack:latest", SIF_COMPRESSION="brotli")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == ["build-sif: SIF_COMPRESSION=brotli: use gzip, lz4, zstd, xz or lzo"]
    assert not any(tmp_path.iterdir())


@pytest.mark.integration
def test_an_image_that_is_not_here_is_refused_naming_the_build(tmp_path):
    refused = build_sif(tmp_path, f"horovod-stack-test-sif:absent-{uuid.uuid4().hex[:6]}")
    assert refused.returncode == 1
    assert "build it first (scripts/build-images.sh)" in refused.stderr and len(refused.stderr.splitlines()) == 1


def in_sif(sif: Path, node_image: str, command: str) -> str:
    """`apptainer exec --cleanenv SIF command`'s output, run as an unprivileged user in a node container."""
    done = subprocess.run(
        ["docker", "run", "--rm", "--privileged", "-v", f"{sif}:/image.sif:ro", node_image, "bash", "-c",
         "chmod 666 /dev/fuse && useradd -m -u 1000 user && "
         f"su user -c 'cd && apptainer -q exec --cleanenv /image.sif {command}'"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def labelled_image(tag: str, base: str, label: str) -> None:
    dockerfile = f"FROM {base}\nLABEL horovod-stack.test-sif={label}\nENV SIF_TEST_VALUE='{ENV_VALUE}'\n"
    subprocess.run(["docker", "build", "-q", "-t", tag, "-"], input=dockerfile, text=True, check=True,
                   capture_output=True, timeout=300)  # fmt: skip


@pytest.fixture
def small_image() -> Iterator[tuple[str, str]]:
    """A tag of this test's own on a small image (the node image and a label), and the node image's tag."""
    tag = f"horovod-stack-test-sif:{uuid.uuid4().hex[:8]}"
    base = node_image()
    labelled_image(tag, base, "1")
    try:
        yield tag, base
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


@pytest.mark.integration
def test_the_sif_is_made_once_per_image_and_replaces_the_older_one(tmp_path, small_image, measured):
    tag, base = small_image
    started = time.monotonic()
    first = build_sif(tmp_path, tag)
    assert first.returncode == 0, first.stderr
    sif = Path(first.stdout.strip().splitlines()[-1])
    measured(f"SIF of a {sif.stat().st_size / 1e6:.0f} MB image: {time.monotonic() - started:.1f} s")
    image_id = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", tag], capture_output=True, text=True)
    assert sif.parent == tmp_path / tag.replace(":", "-")
    assert sif.name.startswith(image_id.stdout.strip().removeprefix("sha256:")) and sif.suffix == ".sif"
    assert oct(sif.stat().st_mode & 0o777) == "0o644"
    assert in_sif(sif, base, "printenv SIF_TEST_VALUE") == ENV_VALUE
    made_at = sif.stat().st_mtime_ns
    again = build_sif(tmp_path, tag)
    assert again.returncode == 0 and Path(again.stdout.strip()) == sif and sif.stat().st_mtime_ns == made_at
    assert "is current" in again.stderr

    labelled_image(tag, base, "2")
    rebuilt = build_sif(tmp_path, tag)
    assert rebuilt.returncode == 0, rebuilt.stderr
    newer = Path(rebuilt.stdout.strip().splitlines()[-1])
    assert newer != sif and newer.exists()
    assert sorted(path.name for path in newer.parent.iterdir()) == [newer.name]


@pytest.mark.integration
def test_an_interrupted_build_leaves_nothing_behind(tmp_path, small_image):
    tag, _ = small_image
    build = subprocess.Popen(
        [BUILD_SIF], env={**os.environ, "IMAGE": tag, "SIF_CACHE": str(tmp_path)}, stderr=subprocess.PIPE, text=True
    )
    folder = tmp_path / tag.replace(":", "-")
    deadline = time.monotonic() + 60
    while not any(folder.glob(".build.*/rootfs")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert any(folder.glob(".build.*/rootfs")), "the build never started unpacking the image"
    build.send_signal(signal.SIGTERM)
    assert build.wait(timeout=60) == 130
    assert list(folder.iterdir()) == []
    for which in (f"name=horovod-stack-sif-{build.pid}", f"ancestor={tag}"):  # the builder, the export's container
        listed = subprocess.run(["docker", "ps", "-aq", "--filter", which], capture_output=True, text=True, check=True)
        assert listed.stdout.strip() == "", which


@pytest.mark.integration
def test_a_cache_without_room_for_the_build_is_refused_in_one_line_and_keeps_nothing(tmp_path, small_image):
    """The build unpacks the image and squashes it at once: where the cache's disk lacks the room, it says how much
    it needs and where to make it, before it starts, and the stale SIF it removed first was of no more use."""
    tag, _ = small_image
    cache = tmp_path / "small-disk"
    cache.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(cache)], check=True)
    try:
        stale = cache / tag.replace(":", "-") / "0123abcd.r1.sif"
        stale.parent.mkdir()
        stale.write_bytes(b"\0" * (1 << 20))
        refused = build_sif(cache, tag)
        assert refused.returncode == 1, refused.stderr
        said = refused.stderr.strip().splitlines()[-1]
        assert said.startswith(f"build-sif: building the SIF of {tag} needs about "), said
        assert "MiB free in" in said and "set SIF_CACHE" in said, said
        assert not stale.exists() and list(stale.parent.iterdir()) == []
    finally:
        subprocess.run(["umount", str(cache)], check=True)


@pytest.mark.integration
def test_prune_removes_the_sifs_of_images_no_tag_names_and_keeps_the_current_ones(tmp_path, small_image):
    """scripts/test.sh prunes after it builds the images: a SIF is several GB, and one of an image rebuilt since is of
    no use to anyone."""
    tag, _ = small_image
    built = build_sif(tmp_path, tag)
    assert built.returncode == 0, built.stderr
    sif = Path(built.stdout.strip().splitlines()[-1])
    prune = [str(BUILD_SIF), "prune"]
    subprocess.run(prune, check=True, timeout=60, env={**os.environ, "SIF_CACHE": str(tmp_path)})
    assert sif.exists(), "the SIF of a tagged image was pruned"
    subprocess.run(["docker", "rmi", "-f", tag], check=True, capture_output=True)
    pruned = subprocess.run(
        prune, capture_output=True, text=True, timeout=60, env={**os.environ, "SIF_CACHE": str(tmp_path)}
    )
    assert pruned.returncode == 0 and not sif.exists(), pruned.stderr
    assert f"removing {sif} (its image is gone" in pruned.stderr
