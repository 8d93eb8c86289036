"""Whether a test that runs the stack's image can: Docker and the image on this machine, asked once per module."""

from __future__ import annotations

import os
import shutil
import subprocess

IMAGE = os.environ.get("IMAGE", "horovod-stack:latest")
"""The image under test (IMAGE, as scripts/test.sh and the README name it)."""


def image_missing(image: str = IMAGE) -> str | None:
    """Why a test of `image` cannot run here (no Docker, no image), or None."""
    if shutil.which("docker") is None:
        return "needs Docker"
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode:
        return f"needs the image {image} (scripts/build-images.sh)"
    return None
