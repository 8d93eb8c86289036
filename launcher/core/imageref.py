"""Image references as Docker and registries spell them, `[REGISTRY/]PATH[:TAG][@DIGEST]`, and where each comes from:
a registry host named in its first part (`ghcr.io/team/img:1`, `10.0.0.5:5000/img`, `localhost/img`), Docker Hub
for any other name with a path or a digest (`team/img:1`, `img@sha256:...`), or this machine and the nodes alone
for a bare name (`horovod-stack:latest`, which no registry holds). The grammar is Docker's (distribution's
reference package): lowercase path components, a tag of up to 128 word characters, a digest `ALGORITHM:HEX`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DOCKER_HUB = "Docker Hub"

PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
REGISTRY_HOST = re.compile(rf"{HOST_LABEL}(?:\.{HOST_LABEL})*(?::\d+)?")
TAG = re.compile(r"\w[\w.-]{0,127}")
DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")

REFERENCE_FIX = (
    "write NAME[:TAG] (lowercase, e.g. horovod-stack:latest), USER/NAME:TAG for Docker Hub, or REGISTRY/NAME:TAG"
)


@dataclass(frozen=True)
class ImageRef:
    registry: str | None
    """The registry host named in the reference (host[:port]); None: Docker Hub, or no registry at all."""
    path: str
    """The repository path: `horovod-stack`, `team/horovod-stack`."""
    tag: str | None = None
    digest: str | None = None
    """`sha256:...`: this very image, whatever tags point at now."""

    @property
    def pulled(self) -> bool:
        """Whether a node that lacks it pulls it: a registry or Docker Hub holds it. A bare name (no registry, no
        path, no digest) is this machine's own build, which no registry holds."""
        return self.registry is not None or "/" in self.path or self.digest is not None

    @property
    def source(self) -> str:
        """Where a pull fetches it from: the registry host, or Docker Hub."""
        return self.registry or DOCKER_HUB


def _is_registry(first: str) -> bool:
    # Docker's rule: a first component with a dot, a port or uppercase letters, or `localhost`, is a host.
    return "." in first or ":" in first or first == "localhost" or first != first.lower()


def parse_image(text: str) -> ImageRef:
    """The reference's parts; ValueError (a reason naming the fix) for one Docker would refuse."""
    rest, at, digest = text.partition("@")
    if at and not DIGEST.fullmatch(digest):
        raise ValueError(f"its digest {digest!r} is not ALGORITHM:HEX (sha256:<64 hex digits>)")
    first, slash, remainder = rest.partition("/")
    registry = first if slash and _is_registry(first) else None
    if registry is not None and not REGISTRY_HOST.fullmatch(registry):
        raise ValueError(f"{registry!r} is not a registry host[:port]; {REFERENCE_FIX}")
    path = remainder if registry is not None else rest
    last = path.rsplit("/", 1)[-1]
    tag = None
    if ":" in last:
        path, tag = path.rsplit(":", 1)
        if not TAG.fullmatch(tag):
            raise ValueError(f"its tag {tag!r} is not up to 128 letters, digits, '_', '.' or '-'; {REFERENCE_FIX}")
    components = path.split("/")
    bad = next((part for part in components if not PATH_COMPONENT.fullmatch(part)), None)
    if bad is not None:
        raise ValueError(f"{bad!r} is not a lowercase name part; {REFERENCE_FIX}")
    return ImageRef(registry, path, tag, digest or None)
