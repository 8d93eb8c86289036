"""The image reaching nodes that lack it, on test hosts of this module's own (tests/multihost.py's harness 1:
`puller_1`, and `puller_2` as a spare), in the group beside the shared test hosts' (tests/conftest.py runs it last
there: its copies are heavy on the disk).

- IMAGE names an image in a registry: a node that lacks it pulls it, and the job trains on it; a tag the registry
  lacks is one line naming the fix. A real registry (tests/registry.py). Which nodes pull (those that lack the image,
  not the others) is tests/test_images.py's.
- `--push-image` with a spare that lacks the image: the export goes to the spare alone, and its worker is started
  and checked up front.
"""

from __future__ import annotations

import os
import re

import docker
import pytest

from tests.multihost import Cluster, Network, started_cluster
from tests.registry import Registry
from tests.test_launcher_multihost import error_lines, launcher, start_args

pytestmark = pytest.mark.integration

IMAGE = os.environ.get("IMAGE", "horovod-stack:latest")
NETWORK = Network(1, "puller")
REGISTRY_BYTES = 5 * 1024**3
"""The registry's copy of the image (compressed layers), on this machine's disk beside the test host's."""
TRAIN = ["--", "--dataset", "digits", "--epochs", "2"]


@pytest.fixture(scope="module")
def puller():
    with started_cluster(1, spares=1, network=NETWORK, reserve=REGISTRY_BYTES) as harness:
        yield harness


def test_an_image_in_a_registry_is_pulled_where_it_lacks_and_the_job_trains_on_it(puller: Cluster, measured):
    source_id = docker.from_env().images.get(IMAGE).id
    node = puller.nodes[0]
    with Registry() as registry:
        pushed, _ = registry.push(IMAGE, "horovod-stack:pulled")
        repository = f"{puller.bridge_address}:{registry.port}/horovod-stack"
        remote = f"{repository}:pulled"
        result = launcher(puller, *start_args(puller, "--image", remote, "--nodes", f"{node.name}:2"), *TRAIN)
        pulls = re.findall(r"(\w+): pulled \S+ in (\d+) s", result.stderr)
        measured(f"registry: pushed in {pushed:.0f} s; pulled: {pulls}")
        assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
        assert [name for name, _ in pulls] == [node.name], result.stderr[-3000:]
        assert node.client().images.get(remote).id == source_id
        assert "parameters identical on all 2 ranks" in result.stdout, result.stdout[-3000:]

        no_such_tag = f"{repository}:no-such-tag"
        missing = launcher(puller, *start_args(puller, "--image", no_such_tag), *TRAIN)
        assert missing.returncode == 1
        assert error_lines(missing)[0].startswith(f"error: {node.name}: pulling {no_such_tag} failed (") and (
            "check the name and tag, or push the image there first" in error_lines(missing)[0]
        ), missing.stderr
    assert puller.project_containers() == {node.name: [] for node in puller.every_node}


def test_a_spare_that_lacks_the_image_gets_it_before_the_job_starts(puller: Cluster, measured):
    """--spares puller_2 --push-image: the spare is the one node without the image, so the export goes to it alone,
    and its worker is started and checked up front, before anything needs it."""
    node, spare = puller.nodes[0], puller.spares[0]
    try:  # the build the first test pulled, under the name this machine's engine gives it
        node.client().images.get(docker.from_env().images.get(IMAGE).id).tag(IMAGE)
    except docker.errors.ImageNotFound:  # this test alone
        puller.ensure_image(IMAGE, node)
    result = launcher(
        puller,
        *start_args(puller, "--push-image", "--nodes", f"{node.name}:2", "--spares", spare.name, "--max-restarts", "1"),
        "--",
        "--dataset",
        "digits",
        "--epochs",
        "1",
    )
    assert result.returncode == 0, result.stderr[-5000:] + result.stdout[-3000:]
    pushed = re.search(rf"\] {spare.name}: pushing {re.escape(IMAGE)}: (\S+) of \1 GB", result.stderr)
    assert pushed, result.stderr
    loaded = re.search(rf"{spare.name}: image loaded, \S+ GB in (\d+) s", result.stderr)
    assert loaded and f"{node.name}: image loaded" not in result.stderr, result.stderr
    measured(f"push to the spare alone: {pushed.group(1)} GB loaded in {loaded.group(1)} s")
    assert f"{spare.name}: spare, sshd answers; out of the hostfile until a restart needs it" in result.stderr
    assert puller.has_image(IMAGE, spare)
    assert puller.project_containers() == {node.name: [] for node in puller.every_node}
