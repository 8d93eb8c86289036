"""IMAGE names an image in a registry: a node that lacks it pulls it, and the job trains on it; a tag the registry
lacks is one line naming the fix. A real registry (tests/registry.py) and a test host of this module's own
(tests/multihost.py's harness 1, `puller_1`), so it runs in the room beside the shared test hosts' (tests/conftest.py
runs it last there: its push and pull are heavy on the disk). Which nodes pull (those that lack the image, not the
others) is tests/test_images.py's."""

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
    with started_cluster(1, network=NETWORK, reserve=REGISTRY_BYTES) as harness:
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
            "check the name and tag, or push the image there first" in error_lines(missing)[0]), missing.stderr
    assert puller.project_containers() == {node.name: []}
