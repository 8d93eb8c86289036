"""A real registry (Distribution, Debian's docker-registry package, in a container of the local base image) on this
machine's engine, with host networking: this engine pushes to it as 127.0.0.1:PORT (a loopback registry needs no
TLS), the test hosts pull from it at their bridge's address (their engines trust the test subnet as insecure,
tests/multihost.py)."""

from __future__ import annotations

import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import docker

IMAGE = "horovod-stack-test-registry:bookworm"
BASE_IMAGE = "horovod-stack-base:bookworm"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        return probe.getsockname()[1]


class Registry:
    def __init__(self) -> None:
        self.client = docker.from_env()
        self.port = free_port()
        self.container: Any = None

    def __enter__(self) -> Registry:
        subprocess.run(
            [
                "docker",
                "buildx",
                "build",
                "-q",
                "--build-arg",
                f"BASE_IMAGE={BASE_IMAGE}",
                "-t",
                IMAGE,
                "--load",
                str(Path(__file__).parent / "registry"),
            ],
            check=True,
            capture_output=True,
        )
        self.container = self.client.containers.run(
            IMAGE,
            name=f"horovod-stack-test-registry-{uuid.uuid4().hex[:6]}",
            network_mode="host",
            detach=True,
            environment={"REGISTRY_HTTP_ADDR": f"0.0.0.0:{self.port}"},
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the test registry did not answer: {self.container.logs()[-2000:]!r}") from None
                time.sleep(0.5)

    def push(self, image: str, name: str) -> tuple[float, str]:
        """Pushes `image` as `name` (REPOSITORY:TAG) through 127.0.0.1; returns the seconds it took and the digest the
        registry gave it (sha256:...)."""
        local = f"127.0.0.1:{self.port}/{name}"
        started = time.monotonic()
        subprocess.run(["docker", "tag", image, local], check=True)
        pushed = subprocess.run(["docker", "push", "-q", local], capture_output=True, text=True)
        if pushed.returncode != 0:
            raise RuntimeError(f"docker push {local} failed: {pushed.stderr[-2000:]}")
        repository = local.rsplit(":", 1)[0]
        digests = [d for d in self.client.images.get(local).attrs["RepoDigests"] if d.startswith(f"{repository}@")]
        subprocess.run(["docker", "rmi", local], check=True, capture_output=True)
        return time.monotonic() - started, digests[0].split("@", 1)[1]

    def __exit__(self, *_: object) -> None:
        if self.container is not None:
            self.container.remove(force=True, v=True)
