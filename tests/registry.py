"""A real registry (Distribution, Debian's docker-registry package, in a container of the local base image) on this
machine's engine, with host networking: this engine pushes to it as 127.0.0.1:PORT (a loopback registry needs no
TLS), the test hosts pull from it at their bridge's address (their engines trust the test subnet as insecure,
tests/multihost.py). With `users`, it is a private one: Distribution's htpasswd authentication (bcrypt entries,
made with the bcrypt package the Docker SDK's ssh support brings), so every pull and push needs a `docker login`."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import bcrypt
import docker

IMAGE = "horovod-stack-test-registry:bookworm"
BASE_IMAGE = "horovod-stack-base:bookworm"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        return probe.getsockname()[1]


HTPASSWD = "/etc/horovod-stack-test-registry.htpasswd"


class Registry:
    def __init__(self, users: dict[str, str] | None = None) -> None:
        """users: name and password of each user a private registry lets in (None: anyone pulls and pushes)."""
        self.client = docker.from_env()
        self.port = free_port()
        self.users = users or {}
        self.container: Any = None
        self.folder: str | None = None

    @property
    def address(self) -> str:
        """Where this machine's engine reaches it."""
        return f"127.0.0.1:{self.port}"

    def authentication(self) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
        """Distribution's settings (environment) and the htpasswd file's mount for `users`; none for a public one."""
        if not self.users:
            return {}, {}
        self.folder = tempfile.mkdtemp(prefix="horovod-stack-test-registry-")
        htpasswd = Path(self.folder) / "htpasswd"
        htpasswd.write_text(
            "".join(
                f"{name}:{bcrypt.hashpw(word.encode(), bcrypt.gensalt()).decode()}\n"
                for name, word in self.users.items()
            )
        )
        environment = {
            "REGISTRY_AUTH": "htpasswd",
            "REGISTRY_AUTH_HTPASSWD_REALM": "horovod-stack-test-registry",
            "REGISTRY_AUTH_HTPASSWD_PATH": HTPASSWD,
        }
        return environment, {str(htpasswd): {"bind": HTPASSWD, "mode": "ro"}}

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
        environment, volumes = self.authentication()
        self.container = self.client.containers.run(
            IMAGE,
            name=f"horovod-stack-test-registry-{uuid.uuid4().hex[:6]}",
            network_mode="host",
            detach=True,
            environment={"REGISTRY_HTTP_ADDR": f"0.0.0.0:{self.port}", **environment},
            volumes=volumes,
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
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
