"""The Kubernetes door's document: a job as a Kubeflow MPIJob (kubeflow.org/v2beta1, MPI Operator v0.8).

Pure: from an MpiJobRequest (what `launcher export mpijob` was given: where to run, plus the JobOptions every door
builds) to the MPIJob as a dict, then YAML. Nothing here talks to a cluster. The launcher pod runs the job agent
(launcher/agent/mpijob_pod.py; the pod's arguments are the pod contract's, launcher/core/pod_contract.py agent_args);
every worker pod runs the image's sshd as mpiuser on the stack's port.

What the document says, and why:
- the same image, command and Horovod defaults as the other doors, the user's --env, slots per worker; the image
  from a registry with a tag or digest (`:latest` pulled Always, so every node runs the same build);
- CPU and memory requests on every pod (Burstable: a ResourceQuota counts them, and BestEffort pods go first),
  limits where the user gives them; GPUs as `nvidia.com/gpu` limits on the workers only (the launcher runs no rank);
- the shared folder as a PersistentVolumeClaim at /shared in every pod, and the shared memory the other doors give
  (an emptyDir of medium Memory at /dev/shm);
- pods that pass the Pod Security profile asked for (launcher/k8s/podsecurity.py checks each one): every
  capability dropped, none added unless --ptrace or --rdma, which need the privileged profile;
- `launcherCreationPolicy: AtStartup`: the launcher pod's agent waits for the workers (as long as they may be
  scheduled, or --schedule-timeout), so a job whose workers never all start ends Failed with the agent's cause
  instead of waiting in Created for good (the operator creates no launcher for a worker that never gets Ready, and
  never fails an MPIJob for a worker pod that fails); --deadline bounds the whole job, the wait included
  (`runPolicy.activeDeadlineSeconds`, which the operator gives the launcher's Job);
- an exec readiness probe (the image's `healthcheck` role, which opens no connection: sshd logs nothing for it);
- `sshAuthMountPath` where the image's entrypoint and agent take the operator's keys from (MPIJOB_SSH_AUTH_DIR);
- restart policies Never and `runPolicy.backoffLimit: 0`: a job's status is its first run's, as with the other doors
  (the workers end with the job, so a retried launcher would find none), and a failed launcher pod stays, with its
  log; `cleanPodPolicy: Running` removes the workers that still run, or wait to be scheduled, once it has ended;
- gang scheduling (`runPolicy.schedulingPolicy`, --scheduler volcano or scheduler-plugins), a Kueue LocalQueue
  (--scheduler kueue: its label, and the job created suspended for Kueue to admit), a priority class.
Elastic jobs are refused (ELASTIC_REFUSED).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from app.gpu import GPUS_ASKED
from launcher.core.imageref import parse_image
from launcher.core.job import defaults_unless_set
from launcher.core.options import ENV_NAME, JobOptions, SettingsError
from launcher.core.pod_contract import PodArgs, agent_args
from launcher.core.protocol import (
    MPIJOB_SSH_AUTH_DIR,
    MPIUSER_UID,
    PTRACE_CAPABILITY,
    SHARED_MOUNT,
    SHARED_VOLUME,
    SHM_SIZE,
    SSH_PORT,
    WORKER_CAPABILITIES,
)
from launcher.core.ranks import MPIJOB, ranks_per_node, ranks_problem
from launcher.k8s import podsecurity
from launcher.k8s.resources import Amount, parse_amount, resources, times

API_VERSION = "kubeflow.org/v2beta1"
ENTRYPOINT = "/opt/horovod-stack/docker/entrypoint.sh"
"""The image's ENTRYPOINT (Dockerfile), named in each pod's command so no operator default replaces it."""
LAUNCHER_ROLE, WORKER_ROLE, HEALTHCHECK_ROLE = "mpijob-launcher", "mpijob-worker", "healthcheck"
"""The entrypoint's roles for an MPIJob's pods, and its probe of a worker's sshd (docker/entrypoint.sh)."""
DEFAULT_NAMESPACE = "default"
BACKOFF_LIMIT = 0
MAX_LABEL = 63
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DOCKER_SIZE = re.compile(r"(\d+)([bkmg]?)", re.IGNORECASE)
SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
"""A key of a Kubernetes Secret's data."""
PART_OF = {"app.kubernetes.io/part-of": "horovod-stack"}

WORKER_CPU_PER_RANK, WORKER_MEMORY_PER_RANK = "1", "2Gi"
"""A worker's requests unless --cpu/--memory say otherwise: so much per rank (slot or GPU), no limits."""
LAUNCHER_CPU, LAUNCHER_MEMORY = Amount("250m", "1"), Amount("512Mi", "1Gi")
"""The launcher pod's: the agent, mpirun and the ssh sessions (no rank); with limits, for quotas on limits."""
GPU_RESOURCE = "nvidia.com/gpu"

POD_SECURITY = "baseline"
"""The Pod Security profile the pods pass unless --pod-security says otherwise (podsecurity.PROFILES)."""
RUN_AS_PLATFORM = "platform"
"""--run-as-user platform: no user ids in the pods, for platforms that assign them (OpenShift's restricted SCC)."""
RDMA_CAPABILITIES = WORKER_CAPABILITIES
"""--rdma: what lets a rank lock the memory it registers for InfiniBand or RoCE (the other doors' workers' set)."""
PROBE_PERIOD_SECONDS = 2

SCHEDULERS = ("volcano", "scheduler-plugins", "kueue")
"""--scheduler: the MPI Operator's gang schedulers (runPolicy.schedulingPolicy), or Kueue's admission."""
QUEUED_SCHEDULERS = ("volcano", "kueue")
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

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
    """The claim's name is the other doors' shared volume's name."""
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


def pull_policy(image: str) -> str:
    """`:latest` is pulled every time (a re-push must not leave nodes on different builds); a tag or digest once."""
    ref = parse_image(image)
    return "Always" if ref.tag == "latest" and ref.digest is None else "IfNotPresent"


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
        options = JobOptions(**chosen, door="mpijob")
    except SettingsError as error:
        found += error.problems
        options = JobOptions(door="mpijob", ready_timeout=math.inf, ptrace=False)
    made = MpiJobRequest(job=options, **{key: value for key, value in where.items() if value is not None})
    found += [problem for problem in problems(made) if problem not in found]
    if found:
        raise SettingsError(*found)
    return made


def rank_env(request: MpiJobRequest) -> tuple[str, ...]:
    """What every rank gets: the user's --env, the stack's Horovod defaults they leave unset, and, on GPUs, the flag
    that the ranks were given GPUs. All of it is in the launcher's arguments, one place to change it."""
    gpus = (f"{GPUS_ASKED}=1",) if request.gpus_per_node else ()
    env = request.job.env
    return (*env, *defaults_unless_set((*env, *gpus)), *gpus)


def pod_args(request: MpiJobRequest) -> PodArgs:
    """The launcher pod's arguments (launcher/core/pod_contract.py): the job, with every rank's environment."""
    return PodArgs(options=replace(request.job, env=rank_env(request)), name=request.name)


def container_security(request: MpiJobRequest, capabilities: list[str]) -> dict[str, Any]:
    """A container's securityContext: every capability dropped, `capabilities` added back; no new privileges
    unless ptrace is asked for (py-spy's file capability needs them, as in the other doors)."""
    context: dict[str, Any] = {"capabilities": {"drop": ["ALL"], **({"add": capabilities} if capabilities else {})}}
    if not request.job.ptrace:
        context = {"allowPrivilegeEscalation": False, **context}
    return context


def pod_security_context(request: MpiJobRequest) -> dict[str, Any]:
    """The pods' user (the image's mpiuser, whose group fsGroup makes the claim writable where the volume type
    allows; none with RUN_AS_PLATFORM), never root; seccomp RuntimeDefault for the restricted profile."""
    context: dict[str, Any] = {}
    if request.run_as_user != RUN_AS_PLATFORM:
        uid = int(request.run_as_user)
        context = {"runAsUser": uid, "runAsGroup": uid, "fsGroup": uid}
    context["runAsNonRoot"] = True
    if request.pod_security == "restricted":
        context["seccompProfile"] = {"type": "RuntimeDefault"}
    return context


def _pod(request: MpiJobRequest, container: dict[str, Any], role: str) -> dict[str, Any]:
    """A pod template: its one container with the shared claim and the shared memory mounted."""
    mounts = [{"name": "shared", "mountPath": SHARED_MOUNT}, {"name": "dshm", "mountPath": "/dev/shm"}]
    volumes = [
        {"name": "shared", "persistentVolumeClaim": {"claimName": request.shared_claim}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": k8s_quantity(request.shm_size)}},
    ]
    spec: dict[str, Any] = {
        "securityContext": pod_security_context(request),
        "containers": [{**container, "volumeMounts": mounts}],
        "volumes": volumes,
    }
    if request.priority_class:
        spec["priorityClassName"] = request.priority_class
    broken = podsecurity.violations(spec, request.pod_security)
    if broken:  # a bug of ours: the export promises the profile
        raise RuntimeError(f"the {role} pod breaks Pod Security's {request.pod_security} profile: {'; '.join(broken)}")
    return {"metadata": {"labels": {**PART_OF, "app.kubernetes.io/component": role}}, "spec": spec}


def run_policy(request: MpiJobRequest) -> dict[str, Any]:
    """When the job ends and how it is scheduled: the operator's runPolicy."""
    policy: dict[str, Any] = {"cleanPodPolicy": "Running", "backoffLimit": BACKOFF_LIMIT}
    if request.deadline:
        policy["activeDeadlineSeconds"] = request.deadline
    if request.suspend or request.scheduler == "kueue":
        policy["suspend"] = True
    if request.scheduler in ("volcano", "scheduler-plugins"):
        # The launcher pod is created with the workers (AtStartup) and belongs to the same PodGroup: the whole gang.
        gang: dict[str, Any] = {"minAvailable": request.workers + 1}
        if request.scheduler == "volcano":
            gang |= {"queue": request.queue} if request.queue else {}
            gang |= {"priorityClass": request.priority_class} if request.priority_class else {}
        elif request.job.ready_timeout != math.inf:
            gang["scheduleTimeoutSeconds"] = int(request.job.ready_timeout)
        policy["schedulingPolicy"] = gang
    return policy


def document(request: MpiJobRequest) -> dict[str, Any]:
    """The MPIJob; raises SettingsError with every problem, one per line."""
    found = problems(request)
    if found:
        raise SettingsError(*found)
    image = request.image or ""
    pulled = {"image": image, "imagePullPolicy": pull_policy(image)}
    launcher: dict[str, Any] = {
        "name": "launcher",
        **pulled,
        "command": [ENTRYPOINT],
        "args": [LAUNCHER_ROLE, *agent_args(pod_args(request))],
        "resources": resources(LAUNCHER_CPU, LAUNCHER_MEMORY),
        "securityContext": container_security(request, []),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    refs = [ref for text in request.secret_refs if (ref := secret_ref(text))]
    if refs:  # mpirun passes them on to every rank (-x NAME); the document holds no value
        launcher["env"] = [
            {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}} for name, secret, key in refs
        ]
    gpus = {GPU_RESOURCE: request.gpus_per_node} if request.gpus_per_node else None
    worker: dict[str, Any] = {
        "name": "worker",
        **pulled,
        "command": [ENTRYPOINT],
        "args": [WORKER_ROLE, MPIJOB_SSH_AUTH_DIR],
        "ports": [{"name": "ssh", "containerPort": SSH_PORT}],
        "readinessProbe": {
            "exec": {"command": [ENTRYPOINT, HEALTHCHECK_ROLE]},
            "periodSeconds": PROBE_PERIOD_SECONDS,
            "failureThreshold": 3,
        },
        "resources": resources(request.worker_cpu(), request.worker_memory(), gpus),
        "securityContext": container_security(request, request.worker_capabilities()),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    labels = dict(PART_OF)
    if request.scheduler == "kueue" and request.queue:
        labels[KUEUE_QUEUE_LABEL] = request.queue
    return {
        "apiVersion": API_VERSION,
        "kind": "MPIJob",
        "metadata": {"name": request.name, "namespace": request.namespace, "labels": labels},
        "spec": {
            "slotsPerWorker": request.slots_per_worker,
            "runPolicy": run_policy(request),
            "launcherCreationPolicy": "AtStartup",
            "sshAuthMountPath": MPIJOB_SSH_AUTH_DIR,
            "mpiImplementation": "OpenMPI",
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "Never", "template": _pod(request, launcher, "launcher")},
                "Worker": {
                    "replicas": request.workers,
                    "restartPolicy": "Never",
                    "template": _pod(request, worker, "worker"),
                },
            },
        },
    }


def cluster_needs(request: MpiJobRequest) -> list[str]:
    """What the cluster must have for the document, one line each (the YAML's header)."""
    user = "the user the platform assigns" if request.run_as_user == RUN_AS_PLATFORM else f"uid {request.run_as_user}"
    needs = [
        "the MPI Operator v0.8",
        f"the PersistentVolumeClaim {request.shared_claim} (ReadWriteMany, writable by {user})",
        f"a namespace whose Pod Security level admits the {request.pod_security} profile",
    ]
    if request.gpus_per_node:
        needs.append(f"the NVIDIA device plugin ({GPU_RESOURCE})")
    if request.scheduler in ("volcano", "scheduler-plugins"):
        needs.append(f"the operator started with gang scheduling by {request.scheduler} (--gang-scheduling)")
    if request.scheduler == "kueue":
        needs.append(f"Kueue with its MPIJob integration and the LocalQueue {request.queue}")
    elif request.queue:
        needs.append(f"the Volcano Queue {request.queue}")
    if request.priority_class:
        needs.append(f"the PriorityClass {request.priority_class}")
    return needs


def to_yaml(request: MpiJobRequest) -> str:
    """The MPIJob as YAML, for `kubectl apply -f`, after a comment that says what the cluster needs."""
    import yaml  # only `launcher export` needs it

    body = yaml.safe_dump(document(request), sort_keys=False, default_flow_style=False, width=1000)
    patch = '{"spec":{"runPolicy":{"suspend":false}}}'
    resume = f"; it starts suspended: resume it with `kubectl patch mpijob {request.name} --type merge -p '{patch}'`"
    suspended = resume if request.suspend and request.scheduler != "kueue" else ""
    return (
        f"# MPIJob {request.name}, written by `launcher export mpijob`; apply it with `kubectl apply -f FILE`"
        f"{suspended}.\n# The cluster needs, in namespace {request.namespace}: {'; '.join(cluster_needs(request))}.\n"
        f"{body}"
    )
