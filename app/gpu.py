"""What the trainer needs from a GPU host, and the one-line refusal when a rank that was given GPUs cannot use them.

torch 2.14.1 from PyPI is a CUDA 13.0 build: it needs an NVIDIA driver of version 580 or newer and a GPU of compute
capability 7.5 or higher (Turing and later; CUDA 13 dropped Maxwell, Pascal and Volta). Below that
`torch.cuda.is_available()` is False, and a job that asked for GPUs would quietly train on the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping

GPUS_ASKED = "HOROVOD_STACK_GPUS"
"""Set to 1 in every rank's environment by a door that gave the ranks GPUs (launcher --gpus-per-node, compose's
GPU file)."""
DRIVER_MINIMUM = 580
COMPUTE_CAPABILITY_MINIMUM = (7, 5)


def cuda_problem(environ: Mapping[str, str], cuda_available: bool, no_cuda: bool) -> str | None:
    """Why this rank must not start: GPUs were asked for, CUDA is not usable and --no-cuda was not given."""
    if environ.get(GPUS_ASKED, "") not in ("1", "true", "yes") or cuda_available or no_cuda:
        return None
    major, minor = COMPUTE_CAPABILITY_MINIMUM
    return (
        f"GPUs were asked for but CUDA is not available to this rank: torch is a CUDA 13.0 build, which needs an "
        f"NVIDIA driver >= {DRIVER_MINIMUM} and a GPU of compute capability >= {major}.{minor}; update the driver "
        "(nvidia-smi shows its version), or train on CPUs (no --gpus-per-node, or --no-cuda)"
    )
