"""What each image's framework needs of a GPU host, and the one-line refusals when a rank or a node cannot give it.

torch 2.14.1 from PyPI is a CUDA 13.0 build: it needs an NVIDIA driver of version 580 or newer and a GPU of compute
capability 7.5 or higher (Turing and later; CUDA 13 dropped Maxwell, Pascal and Volta). TensorFlow 2.21's wheel is a
CUDA 12.5.1 build with kernels for sm_60, sm_70, sm_80 and sm_89 (its `build_info`, read in the image): a driver of
525.60.13 or newer (TensorFlow's install guide; CUDA 12's minor-version compatibility) and compute capability 6.0 or
higher (Pascal and later). Neither was run on a GPU here. Below that a framework finds no GPU, and a job that asked
for GPUs would quietly train on the CPU.

The launcher tells which framework an image holds by the image's label (FRAMEWORK_LABEL, set by the Dockerfile; an
image built FROM one of the stack's inherits it); an image without it is checked as PyTorch's.

What a framework's GPU path needs in every rank's environment is its build's `rank_env`; every launch method gives every
build's to every rank of a GPU job (gpu_rank_env), since compose's file and the MPIJob export never read the image's
label, and each framework reads only its own variables.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from app.frameworks import PYTORCH, TENSORFLOW

GPUS_ASKED = "HOROVOD_STACK_GPUS"
"""Set to 1 in every rank's environment by a launch method that gave the ranks GPUs (launcher --gpus, compose's
GPU file)."""
FRAMEWORK_LABEL = "horovod-stack.framework"
"""The image label naming the framework it holds (app/frameworks.py's Framework.name)."""


@dataclass(frozen=True)
class CudaBuild:
    """What one framework's CUDA build needs of a GPU host."""

    framework: str
    cuda: str
    driver_minimum: int
    capability_minimum: tuple[int, int]
    generations: str
    """The GPU generations that compute capability and later are, as vendors name them."""
    rank_env: tuple[tuple[str, str], ...] = ()
    """What every rank of a GPU job needs for this framework's GPU path, unless the job's own environment sets it."""

    @property
    def capability(self) -> str:
        return f"{self.capability_minimum[0]}.{self.capability_minimum[1]}"

    def needs(self) -> str:
        return (
            f"{self.framework} is a CUDA {self.cuda} build, which needs an NVIDIA driver >= {self.driver_minimum} and "
            f"a GPU of compute capability >= {self.capability}"
        )


TORCH_BUILD = CudaBuild("torch", "13.0", 580, (7, 5), "Turing and later")
TENSORFLOW_BUILD = CudaBuild(
    "TensorFlow 2.21",
    "12.5",
    525,
    (6, 0),
    "Pascal and later",
    # Memory growth on every GPU the process sees, as Horovod's TensorFlow recipe sets it: without it each process
    # reserves nearly all of every GPU it maps at start, so a script that pins none leaves the node's other ranks no
    # memory. TensorFlow's variable outranks a script's own set_memory_growth; "false" turns it off.
    rank_env=(("TF_FORCE_GPU_ALLOW_GROWTH", "true"),),
)
BUILDS = {PYTORCH.name: TORCH_BUILD, TENSORFLOW.name: TENSORFLOW_BUILD}
"""Each framework's build, by app/frameworks.py's Framework.name (FRAMEWORK_LABEL's value)."""


def build_of(image_labels: Mapping[str, str] | None) -> CudaBuild:
    """The CUDA build an image's framework is, from its labels; PyTorch's for an image without the label."""
    return BUILDS.get((image_labels or {}).get(FRAMEWORK_LABEL, ""), TORCH_BUILD)


def gpus_asked(environ: Mapping[str, str]) -> bool:
    """Whether a launch method gave this environment's ranks GPUs (GPUS_ASKED set to a yes)."""
    return environ.get(GPUS_ASKED, "") in ("1", "true", "yes")


def gpu_rank_env(user_set: Collection[str]) -> tuple[str, ...]:
    """KEY=VALUE pairs every rank of a job given GPUs gets: GPUS_ASKED, then every build's rank_env that the job's own
    environment (the names in `user_set`) does not set. Every build's, whichever the image holds: the launch methods
    that build the ranks' environment do not all know the image's framework, and each framework ignores the other's
    variables (torch reads no TF_*)."""
    wanted = dict(pair for build in BUILDS.values() for pair in build.rank_env)
    return (f"{GPUS_ASKED}=1", *(f"{name}={value}" for name, value in wanted.items() if name not in user_set))


def cuda_problem(
    environ: Mapping[str, str], cuda_available: bool, no_cuda: bool, build: CudaBuild = TORCH_BUILD
) -> str | None:
    """Why this rank must not start: GPUs were asked for, CUDA is not usable and --no-cuda was not given."""
    if not gpus_asked(environ) or cuda_available or no_cuda:
        return None
    return (
        f"GPUs were asked for but CUDA is not available to this rank: {build.needs()}; update the driver "
        "(nvidia-smi shows its version), or train on CPUs (no --gpus, or --no-cuda)"
    )


GPU_QUERY = ("nvidia-smi", "--query-gpu=index,name,driver_version,compute_cap", "--format=csv,noheader")
"""What the launcher runs in a container with the workers' GPU request, on every node, before a GPU job."""


def gpu_problem(query_output: str, wanted: int, build: CudaBuild = TORCH_BUILD) -> str | None:
    """Why a node cannot run `wanted` ranks on GPUs with `build`, from GPU_QUERY's output there; None if it can."""
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
        if driver_major < build.driver_minimum:
            return (
                f"NVIDIA driver {driver} is older than {build.driver_minimum}, which {build.framework}'s CUDA "
                f"{build.cuda} build needs; update the driver there"
            )
        if (major, minor) < build.capability_minimum:
            return (
                f"GPU {index} ({name}) has compute capability {capability}; {build.framework}'s CUDA {build.cuda} "
                f"build needs {build.capability} or higher ({build.generations})"
            )
    return None
