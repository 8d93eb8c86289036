"""What `launcher export mpijob` was given, checked before anything is written: the MpiJobRequest (where the job runs,
and the job's JobOptions every launch method builds), and every reason the MPI Operator would refuse the MPIJob or the
stack could not run it, one line each naming the fix (problems; request makes one from the flags and raises them all):
names Kubernetes takes, sizes, the image (from a registry, with a tag or digest), the Pod Security profile and the
capabilities it allows, the scheduler and its queue, the secrets' sources. Elastic jobs are refused (ELASTIC_REFUSED).
The document itself is built in launcher/k8s/mpijob.py. Pure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launcher.core.imageref import parse_image
from launcher.core.options import ENV_NAME, JobOptions, SettingsError
from launcher.core.protocol import MPIUSER_UID, PTRACE_CAPABILITY, SHARED_VOLUME, SHM_SIZE, WORKER_CAPABILITIES
from launcher.core.ranks import MPIJOB, ranks_per_node, ranks_problem
from launcher.k8s import podsecurity
from launcher.k8s.resources import Amount, parse_amount, times

DEFAULT_NAMESPACE = "default"
MAX_LABEL = 63
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DOCKER_SIZE = re.compile(r"(\d+)([bkmg]?)", re.IGNORECASE)
SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
"""A key of a Kubernetes Secret's data."""

WORKER_CPU_PER_RANK, WORKER_MEMORY_PER_RANK = "1", "2Gi"
"""A worker's requests unless --cpu/--memory say otherwise: so much per rank (slot or GPU), no limits."""

POD_SECURITY = "baseline"
"""The Pod Security profile the pods pass unless --pod-security says otherwise (podsecurity.PROFILES)."""
RUN_AS_PLATFORM = "platform"
"""--run-as-user platform: no user ids in the pods, for platforms that assign them (OpenShift's restricted SCC)."""
RDMA_CAPABILITIES = WORKER_CAPABILITIES
"""--rdma: what lets a rank lock the memory it registers for InfiniBand or RoCE (the other launch methods' workers'
set)."""

SCHEDULERS = ("volcano", "scheduler-plugins", "kueue")
"""--scheduler: the MPI Operator's gang schedulers (runPolicy.schedulingPolicy), or Kueue's admission."""
QUEUED_SCHEDULERS = ("volcano", "kueue")

ELASTIC_REFUSED = (
    "--elastic: elastic MPIJobs are not supported: the MPI Operator marks the MPIJob Failed as soon as one worker "
    "pod is evicted, while training goes on, and never re-creates a worker pod that failed; run elastic jobs with "
    "`launcher start --elastic`, or export a fixed-size job"
)


@dataclass(frozen=True)
class MpiJobRequest:
    """What `launcher export mpijob` was given: where the job runs, and the job."""

    name: str
    workers: int
    job: JobOptions
    image: str | None = None
    """REGISTRY/NAME:TAG or REGISTRY/NAME@DIGEST, as the cluster's nodes pull it (required)."""
    slots: int | None = None
    """Ranks per worker as given (--slots); None: not given. The ranks themselves are slots_per_worker."""
    gpus_per_node: int = 0
    """GPUs per worker, one rank each (core/ranks.py: slots given too must agree)."""
    namespace: str = DEFAULT_NAMESPACE
    shared_claim: str = SHARED_VOLUME
    """The claim's name is the other launch methods' shared volume's name."""
    shm_size: str = SHM_SIZE
    secret_refs: tuple[str, ...] = ()
    """--secret NAME=SECRET/KEY each: the launcher pod's NAME comes from key KEY of the Kubernetes Secret SECRET."""
    cpu: str | None = None
    """Each worker's CPU, REQUEST[:LIMIT] (default WORKER_CPU_PER_RANK per rank, no limit)."""
    memory: str | None = None
    """Each worker's memory, REQUEST[:LIMIT] (default WORKER_MEMORY_PER_RANK per rank, no limit)."""
    pod_security: str = POD_SECURITY
    """The Pod Security profile the pods are made to pass (podsecurity.PROFILES)."""
    rdma: bool = False
    """Workers get IPC_LOCK (RDMA's locked memory; privileged profile only)."""
    run_as_user: str = str(MPIUSER_UID)
    """The pods' user id, or RUN_AS_PLATFORM."""
    deadline: int | None = None
    """runPolicy.activeDeadlineSeconds: the whole job's seconds, the wait for its workers included."""
    scheduler: str | None = None
    queue: str | None = None
    priority_class: str | None = None
    suspend: bool = False

    @property
    def slots_per_worker(self) -> int:
        """A worker's ranks: one per GPU, else the slots, else 1 (core/ranks.py)."""
        return ranks_per_node(self.slots, self.gpus_per_node, MPIJOB)

    def worker_pod(self, index: int) -> str:
        return f"{self.name}-worker-{index}"

    def worker_capabilities(self) -> list[str]:
        return [*(RDMA_CAPABILITIES if self.rdma else ()), *((PTRACE_CAPABILITY,) if self.job.ptrace else ())]

    def worker_cpu(self) -> Amount:
        return parse_amount(self.cpu, "cpu") if self.cpu else Amount(times(WORKER_CPU_PER_RANK, self.slots_per_worker))

    def worker_memory(self) -> Amount:
        if self.memory:
            return parse_amount(self.memory, "memory")
        return Amount(times(WORKER_MEMORY_PER_RANK, self.slots_per_worker))


def secret_ref(text: str) -> tuple[str, str, str] | None:
    """NAME, SECRET and KEY of `--secret NAME=SECRET/KEY`; None if `text` is not that."""
    name, _, source = text.partition("=")
    secret, _, key = source.partition("/")
    if ENV_NAME.fullmatch(name) and DNS_1123_SUBDOMAIN.fullmatch(secret) and SECRET_KEY.fullmatch(key):
        return name, secret, key
    return None


def k8s_quantity(size: str) -> str:
    """A Docker size (1g, 512m, 64k, bytes) as Kubernetes writes it (1Gi, 512Mi, 64Ki); Docker's units are binary."""
    found = DOCKER_SIZE.fullmatch(size.strip())
    if not found:
        raise ValueError(f"shared memory size {size!r} is not a number with an optional b, k, m or g")
    unit = {"": "", "b": "", "k": "Ki", "m": "Mi", "g": "Gi"}[found.group(2).lower()]
    return f"{found.group(1)}{unit}"


def image_problem(image: str | None) -> str | None:
    """Why the nodes could not pull `image` as the same build everywhere; None if they can."""
    fix = "pass --image REGISTRY/NAME:TAG (or set IMAGE in .env): the image pushed to a registry the nodes pull from"
    if not image:
        return f"no image: {fix}"
    try:
        ref = parse_image(image)
    except ValueError as error:
        return f"--image {image!r} is not an image reference Kubernetes takes: {error}"
    if ref.registry is None:
        return (
            f"--image {image!r} names no registry host, so the nodes would pull it from Docker Hub; {fix} "
            "(docker.io/USER/NAME:TAG for Docker Hub)"
        )
    if ref.tag is None and ref.digest is None:
        return f"--image {image!r} has no tag: pass {image}:TAG or {image}@sha256:DIGEST"
    return None


def _name_problems(request: MpiJobRequest) -> list[str]:
    found = []
    name = request.name
    if not DNS_1035_LABEL.fullmatch(name):
        found.append(
            f"--name {name!r} is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter and "
            "ending with a letter or digit); pass such a --name"
        )
    last = request.worker_pod(max(request.workers - 1, 0))
    if len(last) > MAX_LABEL:
        room = MAX_LABEL - len(last) + len(name)
        found.append(
            f"--name {name!r} is too long: the last worker pod's name {last} has {len(last)} characters and "
            f"Kubernetes allows {MAX_LABEL}; pass a --name of at most {room} characters"
        )
    if not DNS_1123_LABEL.fullmatch(request.namespace) or len(request.namespace) > MAX_LABEL:
        found.append(f"--namespace {request.namespace!r} is not a Kubernetes namespace name; pass an existing one")
    if not DNS_1123_SUBDOMAIN.fullmatch(request.shared_claim) or len(request.shared_claim) > 253:
        found.append(
            f"--shared-claim {request.shared_claim!r} is not a PersistentVolumeClaim name (lowercase letters, digits, "
            "'-' and '.'); pass the name of your claim"
        )
    return found


def _size_problems(request: MpiJobRequest) -> list[str]:
    found = []
    if request.workers < 1:
        found.append(f"--workers {request.workers}: an MPIJob needs at least 1 worker; pass --workers 1 or more")
    ranks = ranks_problem(request.slots, request.gpus_per_node, MPIJOB)
    if ranks:
        found.append(ranks)
    # A worker's CPU and memory default to so much per rank: not worked out from ranks that do not go together.
    for getter in () if ranks else (request.worker_cpu, request.worker_memory):
        try:
            getter()
        except ValueError as error:
            found.append(str(error))
    try:
        k8s_quantity(request.shm_size)
    except ValueError as error:
        found.append(str(error))
    return found


def _security_problems(request: MpiJobRequest) -> list[str]:
    found = []
    profile = request.pod_security
    if profile not in podsecurity.PROFILES:
        choices = " or ".join(podsecurity.PROFILES)
        found.append(f"--pod-security {profile!r} is not a Pod Security profile; pass {choices}")
    for flag, wanted, capabilities in (
        ("--ptrace", request.job.ptrace, (PTRACE_CAPABILITY,)),
        ("--rdma", request.rdma, RDMA_CAPABILITIES),
    ):
        if wanted and profile != "privileged":
            found.append(
                f"{flag} adds {', '.join(capabilities)}, which Pod Security's {profile} profile refuses: add "
                f"--pod-security privileged (for a namespace that enforces privileged), or drop {flag}"
            )
    user = request.run_as_user
    if user != RUN_AS_PLATFORM and not (user.isdigit() and int(user) > 0):
        found.append(
            f"--run-as-user {user!r} is neither a user id above 0 (the pods never run as root) nor "
            f"{RUN_AS_PLATFORM!r} (the platform assigns one); pass one of those"
        )
    return found


def _scheduling_problems(request: MpiJobRequest) -> list[str]:
    found = []
    scheduler, queue = request.scheduler, request.queue
    for flag, seconds in (("--schedule-timeout", request.job.ready_timeout), ("--deadline", request.deadline)):
        if seconds is not None and seconds != math.inf and (seconds < 1 or seconds != int(seconds)):
            found.append(f"{flag} {seconds}: pass whole seconds, 1 or more (leave it out for no limit)")
    if scheduler is not None and scheduler not in SCHEDULERS:
        found.append(f"--scheduler {scheduler!r} is not one of {', '.join(SCHEDULERS)}; pass one of those")
    elif queue is not None and scheduler not in QUEUED_SCHEDULERS:
        found.append(
            f"--queue {queue!r} needs a scheduler with queues: add --scheduler volcano (a Volcano Queue) or "
            f"--scheduler kueue (a Kueue LocalQueue){'; scheduler-plugins has none' if scheduler else ''}"
        )
    if scheduler == "kueue" and queue is None:
        found.append("--scheduler kueue needs the LocalQueue: pass --queue NAME")
    if queue is not None and (not DNS_1123_LABEL.fullmatch(queue) or len(queue) > MAX_LABEL):
        found.append(f"--queue {queue!r} is not a queue name (a DNS-1123 label); pass your queue's name")
    pc = request.priority_class
    if pc is not None and (not DNS_1123_SUBDOMAIN.fullmatch(pc) or len(pc) > 253):
        found.append(f"--priority-class {pc!r} is not a PriorityClass name; pass one `kubectl get priorityclass` lists")
    return found


def problems(request: MpiJobRequest) -> list[str]:
    """Why the operator would refuse the job, or the stack could not run it: one line each, naming the fix."""
    found = _name_problems(request) + _size_problems(request)
    fit = request.job.workers_problem(max(request.workers, 1))
    if fit:
        found.append(fit)
    if request.job.elastic:
        found.append(ELASTIC_REFUSED)
    image = image_problem(request.image)
    if image:
        found.append(image)
    found += _security_problems(request) + _scheduling_problems(request)
    found += [
        f"--secret {text!r} is not NAME=SECRET/KEY (a variable, a Kubernetes Secret and its key): pass e.g. "
        "--secret WANDB_API_KEY=wandb/api-key"
        for text in request.secret_refs
        if secret_ref(text) is None
    ]
    return found


def request(job: Mapping[str, Any], **where: Any) -> MpiJobRequest:
    """The request `launcher export mpijob` makes of its flags: `job` the job options' (by JobOptions name), `where`
    the MpiJobRequest's own. With no ready_timeout (--schedule-timeout) the agent waits for the workers as long as
    they may be scheduled; no ptrace unless asked (--ptrace). Elastic jobs are refused. Raises SettingsError with
    every problem, the job's and the request's, one line each."""
    chosen = {name: value for name, value in job.items() if value is not None}
    chosen["secrets"] = tuple(text.partition("=")[0] for text in where.get("secret_refs") or ())
    chosen.setdefault("ready_timeout", math.inf)
    chosen.setdefault("ptrace", False)
    found: list[str] = []
    elastic = [chosen.pop("elastic", False), chosen.pop("elastic_min_workers", None) is not None]
    if any(elastic):
        found.append(ELASTIC_REFUSED)
    try:
        options = JobOptions(**chosen, launch_method="mpijob")
    except SettingsError as error:
        found += error.problems
        options = JobOptions(launch_method="mpijob", ready_timeout=math.inf, ptrace=False)
    made = MpiJobRequest(job=options, **{key: value for key, value in where.items() if value is not None})
    found += [problem for problem in problems(made) if problem not in found]
    if found:
        raise SettingsError(*found)
    return made
