"""What the trainer needs from a GPU host, and the one-line refusal when a rank that was given GPUs cannot use them.

torch 2.14.1 from PyPI is a CUDA 13.0 build: it needs an NVIDIA driver of version 580 or newer and a GPU of compute
capability 7.5 or higher (Turing and later; CUDA 13 dropped Maxwell, Pascal and Volta). Below that
`torch.cuda.is_available()` is False, and a job that asked for GPUs would quietly train on the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping

GPUS_ASKED = "HOROVOD_STACK_GPUS"
"""Set to 1 in every rank's environment by a door that gave the ranks GPUs (launcher --gpus, compose's
GPU file)."""
DRIVER_MINIMUM = 580
COMPUTE_CAPABILITY_MINIMUM = (7, 5)


TORCH_BUILD = (
    f"torch is a CUDA 13.0 build, which needs an NVIDIA driver >= {DRIVER_MINIMUM} and a GPU of compute capability "
    f">= {COMPUTE_CAPABILITY_MINIMUM[0]}.{COMPUTE_CAPABILITY_MINIMUM[1]}"
)
TENSORFLOW_BUILD = "TensorFlow 2.21 is a CUDA 12.5 build, which needs an NVIDIA driver >= 525"
"""What each image's framework needs of a GPU host (TensorFlow's from its install guide; not run here: no GPU)."""


def cuda_problem(
    environ: Mapping[str, str], cuda_available: bool, no_cuda: bool, build: str = TORCH_BUILD
) -> str | None:
    """Why this rank must not start: GPUs were asked for, CUDA is not usable and --no-cuda was not given."""
    if environ.get(GPUS_ASKED, "") not in ("1", "true", "yes") or cuda_available or no_cuda:
        return None
    return (
        f"GPUs were asked for but CUDA is not available to this rank: {build}; update the driver "
        "(nvidia-smi shows its version), or train on CPUs (no --gpus, or --no-cuda)"
    )


GPU_QUERY = ("nvidia-smi", "--query-gpu=index,name,driver_version,compute_cap", "--format=csv,noheader")
"""What the launcher runs in a container with the workers' GPU request, on every node, before a GPU job."""


def gpu_problem(query_output: str, wanted: int) -> str | None:
    """Why a node cannot run `wanted` ranks on GPUs, from GPU_QUERY's output there; None if it can."""
    gpus = [[field.strip() for field in line.split(",")] for line in query_output.strip().splitlines() if line.strip()]
    if len(gpus) < wanted:
        return (
            f"only {len(gpus)} GPU(s) visible to a container there, {wanted} asked for; pass a smaller "
            "--gpus, or name free ones by ID (--gpus 2,3)"
        )
    for gpu in gpus:
        try:
            index, name, driver, capability = gpu[:4]
            driver_major = int(driver.split(".")[0])
            major, minor = (int(part) for part in capability.split(".")[:2])
        except ValueError:
            return f"nvidia-smi's answer there could not be read ({', '.join(gpu)}); run `nvidia-smi` on that node"
        if driver_major < DRIVER_MINIMUM:
            return (
                f"NVIDIA driver {driver} is older than {DRIVER_MINIMUM}, which torch's CUDA 13.0 build needs; "
                "update the driver there"
            )
        if (major, minor) < COMPUTE_CAPABILITY_MINIMUM:
            wanted_major, wanted_minor = COMPUTE_CAPABILITY_MINIMUM
            return (
                f"GPU {index} ({name}) has compute capability {capability}; CUDA 13 needs "
                f"{wanted_major}.{wanted_minor} or higher (Turing and later)"
            )
    return None
