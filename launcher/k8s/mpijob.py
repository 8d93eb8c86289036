"""The Kubernetes door's document: a job as a Kubeflow MPIJob (kubeflow.org/v2beta1, MPI Operator v0.8).

Pure: from an MpiJobRequest (what `launcher export mpijob` was given: where to run, plus the JobOptions every door
builds) to the MPIJob as a dict, then YAML. Nothing here talks to a cluster. The launcher pod runs the job agent
(launcher/k8s/launcher_pod.py, the pod's arguments written by its agent_args); every worker pod runs the image's
sshd as mpiuser on the stack's port.

What the document says, and why:
- the same image, command and Horovod defaults as the other doors, the user's --env, slots per worker;
- GPUs as `nvidia.com/gpu` limits on the workers only (the launcher runs no rank);
- the shared folder as a PersistentVolumeClaim at /shared in every pod, and the shared memory the other doors give
  (an emptyDir of medium Memory at /dev/shm);
- `launcherCreationPolicy: WaitForWorkersReady`, with a tcpSocket readiness probe on the workers' sshd port;
- `sshAuthMountPath` where the image's entrypoint and agent take the operator's keys from (MPIJOB_SSH_AUTH_DIR);
- restart policies Never and `runPolicy.backoffLimit: 0`: a job's status is its first run's, as with the other doors
  (the workers end with the job, so a retried launcher would find none), and a failed launcher pod stays, with its
  log; `cleanPodPolicy: Running` removes the workers that still run once the launcher has ended.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from app.gpu import GPUS_ASKED
from launcher.core.job import defaults_unless_set
from launcher.core.options import ENV_NAME, JobOptions, SettingsError
from launcher.core.protocol import (
    DEFAULT_IMAGE,
    MPIJOB_SSH_AUTH_DIR,
    MPIUSER_UID,
    SHARED_MOUNT,
    SHARED_VOLUME,
    SHM_SIZE,
    SSH_PORT,
    WORKER_CAPABILITIES,
)
from launcher.k8s.launcher_pod import PodArgs, agent_args

API_VERSION = "kubeflow.org/v2beta1"
ENTRYPOINT = "/opt/horovod-stack/docker/entrypoint.sh"
"""The image's ENTRYPOINT (Dockerfile), named in each pod's command so no operator default replaces it."""
LAUNCHER_ROLE, WORKER_ROLE = "mpijob-launcher", "mpijob-worker"
"""The entrypoint's roles for an MPIJob's pods (docker/entrypoint.sh)."""
DEFAULT_NAMESPACE = "default"
POD_NIC = "eth0"
"""A pod's own NIC under the usual network plugins: elastic jobs (Gloo) need theirs named."""
BACKOFF_LIMIT = 0
MAX_LABEL = 63
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DOCKER_SIZE = re.compile(r"(\d+)([bkmg]?)", re.IGNORECASE)
SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
"""A key of a Kubernetes Secret's data."""
PART_OF = {"app.kubernetes.io/part-of": "horovod-stack"}


@dataclass(frozen=True)
class MpiJobRequest:
    """What `launcher export mpijob` was given: where the job runs, and the job."""

    name: str
    workers: int
    job: JobOptions
    slots: int | None = None
    """Ranks per worker on CPUs (default 1)."""
    gpus_per_node: int = 0
    """GPUs per worker, one rank each; replaces slots when set."""
    image: str = DEFAULT_IMAGE
    namespace: str = DEFAULT_NAMESPACE
    shared_claim: str = SHARED_VOLUME
    """The claim's name is the other doors' shared volume's name."""
    shm_size: str = SHM_SIZE
    secret_refs: tuple[str, ...] = ()
    """--secret NAME=SECRET/KEY each: the launcher pod's NAME comes from key KEY of the Kubernetes Secret SECRET."""

    @property
    def slots_per_worker(self) -> int:
        return self.gpus_per_node or self.slots or 1

    def worker_pod(self, index: int) -> str:
        return f"{self.name}-worker-{index}"


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


def problems(request: MpiJobRequest) -> list[str]:
    """Why the operator would refuse the job, or the stack could not run it: one line each, naming the fix."""
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
    if request.workers < 1:
        found.append(f"--workers {request.workers}: an MPIJob needs at least 1 worker; pass --workers 1 or more")
    if request.slots is not None and request.slots < 1:
        found.append(f"--slots {request.slots}: each worker needs at least 1 rank; pass --slots 1 or more")
    if request.gpus_per_node < 0:
        found.append(f"--gpus-per-node {request.gpus_per_node}: pass 0 (CPU ranks) or more")
    if request.gpus_per_node and request.slots and request.slots != request.gpus_per_node:
        found.append(
            f"--slots {request.slots} with --gpus-per-node {request.gpus_per_node}: a GPU worker runs one rank per "
            "GPU; drop --slots"
        )
    fit = request.job.workers_problem(max(request.workers, 1))
    if fit:
        found.append(fit)
    if not DNS_1123_LABEL.fullmatch(request.namespace) or len(request.namespace) > MAX_LABEL:
        found.append(f"--namespace {request.namespace!r} is not a Kubernetes namespace name; pass an existing one")
    if not DNS_1123_SUBDOMAIN.fullmatch(request.shared_claim) or len(request.shared_claim) > 253:
        found.append(
            f"--shared-claim {request.shared_claim!r} is not a PersistentVolumeClaim name (lowercase letters, digits, "
            "'-' and '.'); pass the name of your claim"
        )
    try:
        k8s_quantity(request.shm_size)
    except ValueError as error:
        found.append(str(error))
    found += [
        f"--secret {text!r} is not NAME=SECRET/KEY (a variable, a Kubernetes Secret and its key): pass e.g. "
        "--secret WANDB_API_KEY=wandb/api-key"
        for text in request.secret_refs
        if secret_ref(text) is None
    ]
    return found


def request(job: Mapping[str, Any], **where: Any) -> MpiJobRequest:
    """The request `launcher export mpijob` makes of its flags: `job` the job options' (by JobOptions name), `where`
    the MpiJobRequest's own. An elastic job's NIC defaults to the pod's (POD_NIC). Raises SettingsError with every
    problem, the job's and the request's, one line each."""
    chosen = {name: value for name, value in job.items() if value is not None}
    chosen["secrets"] = tuple(text.partition("=")[0] for text in where.get("secret_refs") or ())
    if chosen.get("elastic") and not chosen.get("network_interface"):
        chosen["network_interface"] = POD_NIC
    found: list[str] = []
    try:
        options = JobOptions(**chosen, door="mpijob")
    except SettingsError as error:
        found += error.problems
        options = JobOptions(door="mpijob")
    made = MpiJobRequest(job=options, **{key: value for key, value in where.items() if value is not None})
    found += problems(made)
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
    """The launcher pod's arguments (launcher/k8s/launcher_pod.py): the job, with every rank's environment."""
    return PodArgs(options=replace(request.job, env=rank_env(request)), name=request.name)


def _pod(request: MpiJobRequest, container: dict[str, Any], role: str) -> dict[str, Any]:
    """A pod template: its one container with the shared claim and the shared memory mounted."""
    mounts = [{"name": "shared", "mountPath": SHARED_MOUNT}, {"name": "dshm", "mountPath": "/dev/shm"}]
    volumes = [
        {"name": "shared", "persistentVolumeClaim": {"claimName": request.shared_claim}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": k8s_quantity(request.shm_size)}},
    ]
    # The image runs as mpiuser; fsGroup makes the claim writable for it where the volume type allows.
    ids = {"runAsUser": MPIUSER_UID, "runAsGroup": MPIUSER_UID, "fsGroup": MPIUSER_UID, "runAsNonRoot": True}
    return {
        "metadata": {"labels": {**PART_OF, "app.kubernetes.io/component": role}},
        "spec": {"securityContext": ids, "containers": [{**container, "volumeMounts": mounts}], "volumes": volumes},
    }


def document(request: MpiJobRequest) -> dict[str, Any]:
    """The MPIJob; raises SettingsError with every problem, one per line."""
    found = problems(request)
    if found:
        raise SettingsError(*found)
    image = {"image": request.image, "imagePullPolicy": "IfNotPresent"}
    launcher: dict[str, Any] = {
        "name": "launcher",
        **image,
        "command": [ENTRYPOINT],
        "args": [LAUNCHER_ROLE, *agent_args(pod_args(request))],
    }
    refs = [ref for text in request.secret_refs if (ref := secret_ref(text))]
    if refs:  # mpirun passes them on to every rank (-x NAME); the document holds no value
        launcher["env"] = [
            {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}} for name, secret, key in refs
        ]
    worker: dict[str, Any] = {
        "name": "worker",
        **image,
        "command": [ENTRYPOINT],
        "args": [WORKER_ROLE, MPIJOB_SSH_AUTH_DIR],
        "ports": [{"name": "ssh", "containerPort": SSH_PORT}],
        "readinessProbe": {"tcpSocket": {"port": SSH_PORT}, "periodSeconds": 2, "failureThreshold": 3},
        "securityContext": {"capabilities": {"add": list(WORKER_CAPABILITIES)}},
    }
    if request.gpus_per_node:
        worker["resources"] = {"limits": {"nvidia.com/gpu": request.gpus_per_node}}
    return {
        "apiVersion": API_VERSION,
        "kind": "MPIJob",
        "metadata": {"name": request.name, "namespace": request.namespace, "labels": dict(PART_OF)},
        "spec": {
            "slotsPerWorker": request.slots_per_worker,
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": BACKOFF_LIMIT},
            "launcherCreationPolicy": "WaitForWorkersReady",
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


def to_yaml(request: MpiJobRequest) -> str:
    """The MPIJob as YAML, for `kubectl apply -f`, after a comment that says what the cluster needs."""
    import yaml  # only `launcher export` needs it

    body = yaml.safe_dump(document(request), sort_keys=False, default_flow_style=False, width=1000)
    gpus = ", and the NVIDIA device plugin (nvidia.com/gpu)" if request.gpus_per_node else ""
    return (
        f"# MPIJob {request.name}, written by `launcher export mpijob`; apply it with `kubectl apply -f FILE`.\n"
        f"# The cluster needs the MPI Operator v0.8 and the PersistentVolumeClaim {request.shared_claim} "
        f"(ReadWriteMany, writable by uid {MPIUSER_UID}) in namespace {request.namespace}{gpus}.\n{body}"
    )
