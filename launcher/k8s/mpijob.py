"""The Kubernetes document: a job as a Kubeflow MPIJob (kubeflow.org/v2beta1, MPI Operator v0.8).

Pure: from an MpiJobRequest (what `launcher export mpijob` was given: where to run, plus the JobOptions every launch
method builds) to the MPIJob as a dict, then YAML. Nothing here talks to a cluster. The launcher pod runs the job agent
(launcher/agent/mpijob_pod.py; the pod's arguments are the pod contract's, launcher/core/pod_contract.py agent_args);
every worker pod runs the image's sshd as mpiuser on the stack's port.

What the document says, and why:
- the same image, command and Horovod defaults as the other launch methods, the user's --env, slots per worker; the
  image from a registry with a tag or digest (`:latest` pulled Always, so every node runs the same build);
- CPU and memory requests on every pod (Burstable: a ResourceQuota counts them, and BestEffort pods go first),
  limits where the user gives them; GPUs as `nvidia.com/gpu` limits on the workers only (the launcher runs no rank);
- the shared folder as a PersistentVolumeClaim at /shared in every pod, and the shared memory the other launch methods
  give (an emptyDir of medium Memory at /dev/shm);
- pods that pass the Pod Security profile asked for (launcher/k8s/podsecurity.py checks each one): every
  capability dropped, none added unless --ptrace or --rdma, which need the privileged profile;
- `launcherCreationPolicy: AtStartup`: the launcher pod's agent waits for the workers (as long as they may be
  scheduled, or --schedule-timeout), so a job whose workers never all start ends Failed with the agent's cause
  instead of waiting in Created for good (the operator creates no launcher for a worker that never gets Ready, and
  never fails an MPIJob for a worker pod that fails); --deadline bounds the whole job, the wait included
  (`runPolicy.activeDeadlineSeconds`, which the operator gives the launcher's Job);
- an exec readiness probe (the image's `healthcheck` role, which opens no connection: sshd logs nothing for it);
- `sshAuthMountPath` where the image's entrypoint and agent take the operator's keys from (MPIJOB_SSH_AUTH_DIR);
- restart policies Never and `runPolicy.backoffLimit: 0`: a job's status is its first run's, as with the other launch
  methods (the workers end with the job, so a retried launcher would find none), and a failed launcher pod stays, with
  its log; `cleanPodPolicy: Running` removes the workers that still run, or wait to be scheduled, once it has ended;
- gang scheduling (`runPolicy.schedulingPolicy`, --scheduler volcano or scheduler-plugins), a Kueue LocalQueue
  (--scheduler kueue: its label, and the job created suspended for Kueue to admit), a priority class.
Elastic jobs are refused; what the request may be, and why not, is launcher/k8s/mpijob_request.py's.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from app.gpu import gpu_rank_env
from launcher.core.imageref import parse_image
from launcher.core.jobspec import defaults_unless_set
from launcher.core.options import SettingsError, names_in
from launcher.core.pod_contract import PodArgs, agent_args
from launcher.core.protocol import MPIJOB_SSH_AUTH_DIR, SHARED_MOUNT, SSH_PORT
from launcher.k8s import podsecurity
from launcher.k8s.mpijob_request import RUN_AS_PLATFORM, MpiJobRequest, k8s_quantity, problems, secret_ref
from launcher.k8s.resources import Amount, resources

API_VERSION = "kubeflow.org/v2beta1"
ENTRYPOINT = "/opt/horovod-stack/docker/entrypoint.sh"
"""The image's ENTRYPOINT (Dockerfile), named in each pod's command so no operator default replaces it."""
LAUNCHER_ROLE, WORKER_ROLE, HEALTHCHECK_ROLE = "mpijob-launcher", "mpijob-worker", "healthcheck"
"""The entrypoint's roles for an MPIJob's pods, and its probe of a worker's sshd (docker/entrypoint.sh)."""
BACKOFF_LIMIT = 0
PART_OF = {"app.kubernetes.io/part-of": "horovod-stack"}

LAUNCHER_CPU, LAUNCHER_MEMORY = Amount("250m", "1"), Amount("512Mi", "1Gi")
"""The launcher pod's: the agent, mpirun and the ssh sessions (no rank); with limits, for quotas on limits."""
GPU_RESOURCE = "nvidia.com/gpu"
PROBE_PERIOD_SECONDS = 2
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def pull_policy(image: str) -> str:
    """`:latest` is pulled every time (a re-push must not leave nodes on different builds); a tag or digest once."""
    ref = parse_image(image)
    return "Always" if ref.tag == "latest" and ref.digest is None else "IfNotPresent"


def rank_env(request: MpiJobRequest) -> tuple[str, ...]:
    """What every rank gets: the user's --env, the stack's Horovod defaults they leave unset, and, on GPUs, the flag
    that the ranks were given GPUs with the frameworks' GPU settings they leave unset (app/gpu.py gpu_rank_env).
    All of it is in the launcher's arguments, one place to change it."""
    env = request.job.env
    gpus = gpu_rank_env(names_in(env)) if request.gpus_per_node else ()
    return (*env, *defaults_unless_set((*env, *gpus)), *gpus)


def pod_args(request: MpiJobRequest) -> PodArgs:
    """The launcher pod's arguments (launcher/core/pod_contract.py): the job, with every rank's environment."""
    return PodArgs(options=replace(request.job, env=rank_env(request)), name=request.name)


def container_security(request: MpiJobRequest, capabilities: list[str]) -> dict[str, Any]:
    """A container's securityContext: every capability dropped, `capabilities` added back; no new privileges
    unless ptrace is asked for (py-spy's file capability needs them, as in the other launch methods)."""
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
