"""The two frameworks the stack ships, one image each, and how a rank tells which one it runs on.

Two CUDA stacks cannot share one Python environment (TensorFlow's wheels are CUDA 12 builds, torch's CUDA 13, and
their two NCCLs collide in one process), so each framework has an image of its own: PyTorch's
horovod-stack:latest and TensorFlow's horovod-stack:tensorflow. Which one a process runs in is told by what it can
import (not by an environment variable: ranks on other nodes start through ssh with sshd's environment).

A script written for the other image fails on its first `import torch` (or `import tensorflow`); the image then
ends it with one line naming the image that holds that framework, instead of a traceback (`excepthook`, installed
at start-up by the image's `horovod_stack_hint.pth`, see docker/finish-image.sh).

Stdlib-only and import-free: it runs at the start of every Python process in the images, and the launcher (which
installs without either framework) reads the image names here.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from types import TracebackType


@dataclass(frozen=True)
class Framework:
    name: str
    """As users write it."""
    image: str
    """The image that holds it, as scripts/build-images.sh tags it."""
    modules: tuple[str, ...]
    """Top-level modules that only this framework's image holds: importing one elsewhere is the wrong image."""
    trainer: str
    """The bundled trainer's module for it (`python -m app.train` runs the one the environment holds)."""


PYTORCH = Framework("PyTorch", "horovod-stack:latest", ("torch", "torchvision"), "app.train_torch")
TENSORFLOW = Framework("TensorFlow", "horovod-stack:tensorflow", ("tensorflow", "keras", "tf_keras"), "app.train_keras")
FRAMEWORKS = (PYTORCH, TENSORFLOW)


def of_image(image: str) -> Framework | None:
    """The framework of one of the stack's images by its name (a registry's copy too:
    REGISTRY/horovod-stack:tensorflow); None for any other name (an image FROM one of them tells by its label
    instead: app/gpu.py FRAMEWORK_LABEL)."""
    name = image.rsplit("/", 1)[-1]
    return next((framework for framework in FRAMEWORKS if framework.image == name), None)


def installed() -> Framework | None:
    """The framework this environment holds: the first whose main module can be found here (none is imported)."""
    return next((framework for framework in FRAMEWORKS if importlib.util.find_spec(framework.modules[0])), None)


def wrong_image_message(missing_module: str, current: Framework) -> str | None:
    """The one line for a script that imported `missing_module` on `current`'s image, when another of the stack's
    images holds that module; None when none does (an ordinary missing package)."""
    top = missing_module.split(".")[0]
    wanted = next((f for f in FRAMEWORKS if f is not current and top in f.modules), None)
    if wanted is None:
        return None
    return (
        f"error: this script imports {top} ({wanted.name}), which {current.image} ({current.name}) does not hold: "
        f"run it on {wanted.image} (launcher start --image {wanted.image}; compose: IMAGE={wanted.image})"
    )


def excepthook(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
    """sys.excepthook in the images: a script that dies importing the other image's framework gets one line."""
    name = getattr(error, "name", None) if isinstance(error, ModuleNotFoundError) else None
    current = installed() if name else None
    message = wrong_image_message(name, current) if name and current else None
    if message is None:
        sys.__excepthook__(kind, error, trace)
    else:
        print(message, file=sys.stderr)
        # What the rank's error record says, where the job asks for one (app/rank_error.py ONE_LINE).
        error.horovod_stack_one_line = message  # type: ignore[attr-defined]


def install() -> None:
    """Run at start-up in the images (their horovod_stack_hint.pth)."""
    sys.excepthook = excepthook
