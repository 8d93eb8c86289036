"""The Kubernetes export without a cluster: every exported MPIJob validates against the MPI Operator's CRD schema
(../shared/k8s, v0.8.2), with no field the schema lacks (the API server would drop it silently), and the operator's
own rules the schema leaves out; its pods pass the Pod Security profile asked for (launcher/k8s/podsecurity.py,
itself checked rule by rule against Kubernetes' documented profiles); bad input is one line and exit 2; the
launcher pod's agent reads back what the export wrote, and trusts the operator's keys as the module says.
(The pods' containers for real, on two Docker hosts: test_mpijob_conformance.py.)"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from app.horovod_defaults import HOROVOD_DEFAULTS
from launcher.agent import mpijob_pod
from launcher.agent.mpijob_pod import operator_agent
from launcher.core import pod_contract
from launcher.core.jobspec import JobSpec, Worker
from launcher.core.nics import parse_ip_addresses
from launcher.core.options import JobOptions, SettingsError, job_command
from launcher.core.pod_contract import PodArgs
from launcher.core.protocol import CLUSTER_KEY, HOSTKEYS_DIR, MPIJOB_HOSTFILE, MPIJOB_SSH_AUTH_DIR
from launcher.k8s import mpijob, mpijob_request, podsecurity, resources
from tests.conftest import JOB_OPTIONS, job_spec
from tests.standins import StandInTransport
from tests.test_podsecurity import strictest_profile

SCHEMA = Path(__file__).parent / "k8s" / "mpijob-v2beta1.schema.json"
"""The operator's CRD schema, kept with the tests (tests/k8s/README.md); the workplace's reference copy is below."""
REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "k8s" / SCHEMA.name
LAUNCHER = str(Path(sys.executable).parent / "launcher")
TRAIN = ("--dataset", "digits", "--epochs", "5")
IMAGE = "registry.example.com/horovod-stack:1"


def operator_problems(document: dict) -> list[str]:
    """The checks the MPI Operator makes after the schema (pkg/apis/kubeflow/validation, as ../shared/k8s/README.md
    lists them), with the operator's defaults applied first."""
    found = []
    spec = document["spec"]
    replicas = spec.get("mpiReplicaSpecs", {})
    launcher, worker = replicas.get("Launcher"), replicas.get("Worker")
    if not launcher or launcher.get("replicas", 1) != 1:
        found.append("Launcher must exist with replicas: 1")
    if worker is not None and worker.get("replicas", 1) < 1:
        found.append("Worker replicas must be >= 1")
    for role, replica, default in (("Launcher", launcher, "OnFailure"), ("Worker", worker, "Never")):
        if replica is None:
            continue
        if replica.get("restartPolicy", default) not in ("Never", "OnFailure"):
            found.append(f"{role} restartPolicy must be Never or OnFailure")
        if not replica["template"]["spec"].get("containers"):
            found.append(f"{role} needs a container")
    policy = spec.get("runPolicy", {})
    if policy.get("cleanPodPolicy", "None") not in ("None", "Running", "All"):
        found.append("cleanPodPolicy must be None, Running or All")
    for field in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        if policy.get(field, 0) < 0:
            found.append(f"runPolicy.{field} must be >= 0")
    if spec.get("slotsPerWorker", 1) < 0:
        found.append("slotsPerWorker must be >= 0")
    if spec.get("mpiImplementation", "OpenMPI") not in ("OpenMPI", "Intel", "MPICH"):
        found.append("mpiImplementation must be OpenMPI, Intel or MPICH")
    if not spec.get("sshAuthMountPath", "/root/.ssh"):
        found.append("sshAuthMountPath is required")
    last = f"{document['metadata']['name']}-worker-{(worker or {}).get('replicas', 1) - 1}"
    if len(last) > 63 or not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", last):
        found.append(f"{last} is not a DNS-1035 label")
    return found


def unknown_fields(value, schema: dict, path: str = "") -> list[str]:
    """The document's fields that the schema does not name (it never sets additionalProperties: false, so
    jsonschema lets them pass, and the API server prunes them without a word)."""
    if isinstance(value, dict) and "properties" in schema:
        found = []
        for key, item in value.items():
            if key not in schema["properties"]:
                found.append(f"{path}.{key}")
            else:
                found += unknown_fields(item, schema["properties"][key], f"{path}.{key}")
        return found
    if isinstance(value, list) and "items" in schema:
        return [
            problem
            for index, item in enumerate(value)
            for problem in unknown_fields(item, schema["items"], f"{path}[{index}]")
        ]
    return []


def validate(document: dict, schema: dict) -> None:
    jsonschema.validate(document, schema)
    assert unknown_fields(document, schema) == []
    assert operator_problems(document) == []


@pytest.fixture(scope="module")
def schema():
    return json.loads(SCHEMA.read_text())


@pytest.mark.skipif(not REFERENCE.exists(), reason="no ../shared/k8s beside this checkout")
def test_the_schema_kept_here_is_the_workplaces_reference():
    assert SCHEMA.read_bytes() == REFERENCE.read_bytes()


def export(**fields) -> dict:
    """The document `launcher export mpijob` writes for these flags (the job options' by their JobOptions names)."""
    job = {"command": job_command(TRAIN), **{key: fields.pop(key) for key in list(fields) if key in JOB_OPTIONS}}
    job.setdefault("elastic", job.get("elastic_min_workers") is not None)
    text = mpijob.to_yaml(mpijob_request.request(job, **{"name": "digits", "workers": 2, "image": IMAGE, **fields}))
    assert text.startswith("# MPIJob ")
    return yaml.safe_load(text)


def pods(document: dict) -> tuple[dict, dict]:
    replicas = document["spec"]["mpiReplicaSpecs"]
    return replicas["Launcher"]["template"]["spec"], replicas["Worker"]["template"]["spec"]


def launcher_options(document: dict) -> JobOptions:
    return pod_args(document).options


def pod_args(document: dict) -> PodArgs:
    args = pods(document)[0]["containers"][0]["args"]
    assert args[0] == mpijob.LAUNCHER_ROLE
    return pod_contract.parse(args[1:])


CASES = {
    "cpu": ({}, 1, None),
    "cpu, 3 slots": ({"slots": 3}, 3, None),
    "gpu": ({"gpus_per_node": 2, "image": "registry.example.com/horovod-stack@sha256:" + "a" * 64}, 2, 2),
    "users command": ({"command": ("python", "/shared/code/train.py", "--lr", "0.1"), "env": ("A=1",)}, 1, None),
    "secrets": ({"secret_refs": ("WANDB_API_KEY=wandb/api-key",)}, 1, None),
    "requests and limits": ({"cpu": "4:8", "memory": "16Gi:32Gi"}, 1, None),
    "restricted": ({"pod_security": "restricted"}, 1, None),
    "privileged, ptrace and rdma": ({"pod_security": "privileged", "ptrace": True, "rdma": True}, 1, None),
    "user left to the platform": ({"run_as_user": "platform", "pod_security": "restricted"}, 1, None),
    "volcano": ({"scheduler": "volcano", "queue": "gpu", "priority_class": "high", "gpus_per_node": 8}, 8, 8),
    "scheduler-plugins": ({"scheduler": "scheduler-plugins", "ready_timeout": 600}, 1, None),
    "kueue": ({"scheduler": "kueue", "queue": "team-a"}, 1, None),
    "suspended, deadline": ({"suspend": True, "deadline": 3600, "ready_timeout": 900}, 1, None),
}


@pytest.mark.parametrize("fields,slots,gpus", CASES.values(), ids=CASES.keys())
def test_every_export_validates_against_the_crd_schema_and_the_operators_rules(schema, fields, slots, gpus):
    document = export(**fields)
    validate(document, schema)
    spec = document["spec"]
    assert (document["apiVersion"], document["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    assert spec["slotsPerWorker"] == slots
    assert {key: spec["runPolicy"][key] for key in ("cleanPodPolicy", "backoffLimit")} == {
        "cleanPodPolicy": "Running",
        "backoffLimit": 0,
    }
    assert spec["launcherCreationPolicy"] == "AtStartup"
    assert spec["sshAuthMountPath"] == MPIJOB_SSH_AUTH_DIR
    assert spec["mpiReplicaSpecs"]["Worker"]["replicas"] == fields.get("workers", 2)
    launcher, worker = pods(document)
    profile = fields.get("pod_security", "baseline")
    for pod in (launcher, worker):
        assert podsecurity.violations(pod, profile) == []
        container = pod["containers"][0]
        assert container["image"] == fields.get("image", IMAGE)
        assert container["imagePullPolicy"] == "IfNotPresent"
        assert container["command"] == [mpijob.ENTRYPOINT]
        assert {m["mountPath"]: m["name"] for m in container["volumeMounts"]} == {
            "/shared": "shared",
            "/dev/shm": "dshm",
        }
        assert pod["volumes"] == [
            {"name": "shared", "persistentVolumeClaim": {"claimName": "horovod-stack-shared"}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
        ]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"].get("runAsUser") == (None if "run_as_user" in fields else 1000)
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert set(container["resources"]["requests"]) == {"cpu", "memory"}  # Burstable at least, never BestEffort
        assert pod.get("priorityClassName") == fields.get("priority_class")
    assert launcher["containers"][0]["resources"] == {
        "requests": {"cpu": "250m", "memory": "512Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }
    probe = worker["containers"][0]["readinessProbe"]
    assert probe["exec"] == {"command": [mpijob.ENTRYPOINT, "healthcheck"]}  # opens no connection: sshd logs nothing
    assert worker["containers"][0]["args"] == [mpijob.WORKER_ROLE, MPIJOB_SSH_AUTH_DIR]
    limits = worker["containers"][0]["resources"].get("limits", {})
    assert limits.get("nvidia.com/gpu") == gpus


def test_workers_request_a_core_and_2gi_per_rank_unless_told_and_limits_only_where_given():
    def worker_resources(**fields):
        return pods(export(**fields))[1]["containers"][0]["resources"]

    assert worker_resources() == {"requests": {"cpu": "1", "memory": "2Gi"}}
    assert worker_resources(gpus_per_node=8) == {
        "requests": {"cpu": "8", "memory": "16Gi"},
        "limits": {"nvidia.com/gpu": 8},
    }
    assert worker_resources(slots=3, cpu="500m") == {"requests": {"cpu": "500m", "memory": "6Gi"}}
    assert worker_resources(cpu="4:8", memory="16Gi:32Gi", gpus_per_node=2) == {
        "requests": {"cpu": "4", "memory": "16Gi"},
        "limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": 2},
    }


QUANTITIES = {
    "cores": ("cpu", "2", resources.Amount("2")),
    "millicores and a limit": ("cpu", "500m:2", resources.Amount("500m", "2")),
    "a fraction": ("cpu", "0.5", resources.Amount("0.5")),
    "binary memory": ("memory", "16Gi:32Gi", resources.Amount("16Gi", "32Gi")),
    "decimal memory": ("memory", "8G", resources.Amount("8G")),
    "a limit below the request": ("memory", "32Gi:16Gi", "the limit 16Gi is below the request 32Gi"),
    "no unit on memory": ("memory", "16", "is under 1Mi: a memory quantity is in bytes unless it has a unit"),
    "not a quantity": ("cpu", "two", "'two' is not a positive Kubernetes quantity; pass e.g. --cpu 4"),
    "zero": ("cpu", "0", "is not a positive Kubernetes quantity"),
    "a docker size": ("memory", "16g", "'16g' is not a positive Kubernetes quantity; pass e.g. --memory 16Gi"),
}


@pytest.mark.parametrize("resource,text,expected", QUANTITIES.values(), ids=QUANTITIES.keys())
def test_cpu_and_memory_are_kubernetes_quantities(resource, text, expected):
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=re.escape(expected)):
            resources.parse_amount(text, resource)
    else:
        assert resources.parse_amount(text, resource) == expected


IMAGES = {
    "a registry and a tag": ("registry.example.com/team/horovod-stack:1", None, "IfNotPresent"),
    "the TensorFlow image": ("registry.example.com/team/horovod-stack:tensorflow", None, "IfNotPresent"),
    "a registry port": ("10.0.0.5:5000/horovod-stack:1", None, "IfNotPresent"),
    "a digest": ("ghcr.io/team/horovod-stack@sha256:" + "0" * 64, None, "IfNotPresent"),
    "latest": ("ghcr.io/team/horovod-stack:latest", None, "Always"),
    "Docker Hub spelt out": ("docker.io/team/horovod-stack:1", None, "IfNotPresent"),
    "no image": ("", "no image: pass --image REGISTRY/NAME:TAG (or set IMAGE in .env)", None),
    "the local build": (
        "horovod-stack:latest",
        "names no registry host, so the nodes would pull it from Docker Hub",
        None,
    ),
    "a Docker Hub short name": ("team/horovod-stack:1", "names no registry host", None),
    "no tag": ("ghcr.io/team/horovod-stack", "has no tag: pass ghcr.io/team/horovod-stack:TAG", None),
    "uppercase": ("Registry/UPPER:tag", "is not an image reference Kubernetes takes: 'UPPER' is not a lowercase", None),
    "a bad tag": ("ghcr.io/team/img:v1!", "is not an image reference Kubernetes takes: its tag 'v1!'", None),
}


@pytest.mark.parametrize("image,problem,policy", IMAGES.values(), ids=IMAGES.keys())
def test_the_image_comes_from_a_registry_with_a_tag_and_latest_is_always_pulled(image, problem, policy):
    found = mpijob_request.image_problem(image)
    if problem:
        assert found is not None and problem in found
    else:
        assert found is None
        assert mpijob.pull_policy(image) == policy
        assert pods(export(image=image))[1]["containers"][0]["imagePullPolicy"] == policy


def test_scheduling_writes_the_operators_scheduling_policy_a_kueue_label_and_suspend():
    volcano = export(scheduler="volcano", queue="gpu", priority_class="high", workers=4)
    assert volcano["spec"]["runPolicy"]["schedulingPolicy"] == {
        "minAvailable": 5,
        "queue": "gpu",
        "priorityClass": "high",
    }
    plugins = export(scheduler="scheduler-plugins", ready_timeout=600)["spec"]["runPolicy"]
    assert plugins["schedulingPolicy"] == {"minAvailable": 3, "scheduleTimeoutSeconds": 600}
    kueue = export(scheduler="kueue", queue="team-a")
    assert kueue["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert kueue["spec"]["runPolicy"]["suspend"] is True and "schedulingPolicy" not in kueue["spec"]["runPolicy"]
    plain = export()["spec"]["runPolicy"]
    assert plain == {"cleanPodPolicy": "Running", "backoffLimit": 0}
    assert export(suspend=True, deadline=3600)["spec"]["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "backoffLimit": 0,
        "activeDeadlineSeconds": 3600,
        "suspend": True,
    }


def test_the_launcher_waits_for_its_workers_as_long_as_they_may_be_scheduled_unless_told():
    assert launcher_options(export()).ready_timeout == math.inf
    assert "--schedule-timeout" not in pods(export())[0]["containers"][0]["args"]
    assert launcher_options(export(ready_timeout=900)).ready_timeout == 900


def test_elastic_mpijobs_are_refused_in_one_line_saying_why():
    for fields in ({"elastic": True, "network_interface": "eth0"}, {"elastic_min_workers": 1}):
        with pytest.raises(SettingsError) as refused:
            export(**fields)
        assert refused.value.problems == [mpijob_request.ELASTIC_REFUSED]
    assert "evicted" in mpijob_request.ELASTIC_REFUSED and "\n" not in mpijob_request.ELASTIC_REFUSED


def test_the_launcher_pod_runs_the_same_command_with_the_stacks_defaults_and_the_users_env():
    options = launcher_options(export(env=("NCCL_DEBUG=INFO", "A=1")))
    assert pod_args(export()).name == "digits"
    assert options.command == tuple(job_command(TRAIN))
    assert options.env == ("NCCL_DEBUG=INFO", "A=1", "OMPI_MCA_mpi_yield_when_idle=1")  # the user's NCCL_DEBUG wins
    assert set(HOROVOD_DEFAULTS) <= {item.partition("=")[0] for item in options.env}
    gpu = launcher_options(export(gpus_per_node=4))
    assert "HOROVOD_STACK_GPUS=1" in gpu.env and "TF_FORCE_GPU_ALLOW_GROWTH=true" in gpu.env
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in str(options.env)  # a CPU job: nothing for GPUs
    mine = launcher_options(export(gpus_per_node=4, env=("TF_FORCE_GPU_ALLOW_GROWTH=false",))).env
    assert [item for item in mine if item.startswith("TF_FORCE")] == ["TF_FORCE_GPU_ALLOW_GROWTH=false"]
    user = launcher_options(export(command=("python", "train.py")))
    assert user.command == ("python", "train.py")


def test_a_secret_comes_from_a_kubernetes_secret_and_only_its_name_is_in_the_document():
    document = export(secret_refs=("WANDB_API_KEY=wandb/api-key", "HF_TOKEN=hf.tokens/read"))
    launcher = pods(document)[0]["containers"][0]
    assert launcher["env"] == [
        {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf.tokens", "key": "read"}}},
    ]
    assert launcher_options(document).secrets == ("WANDB_API_KEY", "HF_TOKEN")
    assert "env" not in pods(document)[1]["containers"][0]  # the workers get them from mpirun (-x NAME)


BAD = {
    "not a DNS-1035 label": ({"name": "Digits_1"}, "--name 'Digits_1' is not a DNS-1035 label"),
    "starts with a digit": ({"name": "1digits"}, "is not a DNS-1035 label"),
    "too long for its last worker": (
        {"name": "a" * 55, "workers": 100},
        f"the last worker pod's name {'a' * 55}-worker-99 has 65 characters and "
        "Kubernetes allows 63; pass a --name of at most 53 characters",
    ),
    "no workers": ({"workers": 0}, "--workers 0: an MPIJob needs at least 1 worker"),
    "bad env": ({"env": ("1A=2",)}, "--env '1A=2' is not KEY=VALUE"),
    "slots beside gpus": ({"slots": 2, "gpus_per_node": 4}, "a GPU worker runs one rank per GPU; drop --slots"),
    "elastic": ({"elastic_min_workers": 3}, "--elastic: elastic MPIJobs are not supported"),
    "ptrace in baseline": (
        {"ptrace": True},
        "--ptrace adds SYS_PTRACE, which Pod Security's baseline profile refuses: add --pod-security privileged",
    ),
    "rdma in restricted": (
        {"rdma": True, "pod_security": "restricted"},
        "--rdma adds IPC_LOCK, which Pod Security's restricted profile refuses",
    ),
    "no such profile": ({"pod_security": "strict"}, "--pod-security 'strict' is not a Pod Security profile"),
    "root": ({"run_as_user": "0"}, "--run-as-user '0' is neither a user id above 0"),
    "no image": ({"image": None}, "no image: pass --image"),
    "unknown scheduler": ({"scheduler": "yunikorn"}, "--scheduler 'yunikorn' is not one of volcano"),
    "queue without scheduler": ({"queue": "q"}, "--queue 'q' needs a scheduler with queues"),
    "queue with scheduler-plugins": ({"queue": "q", "scheduler": "scheduler-plugins"}, "scheduler-plugins has none"),
    "kueue without a queue": ({"scheduler": "kueue"}, "--scheduler kueue needs the LocalQueue: pass --queue NAME"),
    "bad priority class": ({"priority_class": "High_1"}, "--priority-class 'High_1' is not a PriorityClass name"),
    "zero deadline": ({"deadline": 0}, "--deadline 0: pass whole seconds, 1 or more"),
    "zero schedule timeout": ({"ready_timeout": 0}, "--schedule-timeout 0"),
    "bad memory": ({"memory": "lots"}, "--memory 'lots': 'lots' is not a positive Kubernetes quantity"),
    "bad namespace": ({"namespace": "Team_A"}, "--namespace 'Team_A' is not a Kubernetes namespace name"),
    "secret without its source": (
        {"secret_refs": ("WANDB_API_KEY",)},
        "--secret 'WANDB_API_KEY' is not NAME=SECRET/KEY",
    ),
    "secret from a bad Secret name": ({"secret_refs": ("K=Bad_Name/key",)}, "is not NAME=SECRET/KEY"),
    "secret beside --env": ({"secret_refs": ("K=s/k",), "env": ("K=1",)}, "K is both a secret (--secret) and in --env"),
}


@pytest.mark.parametrize("fields,message", BAD.values(), ids=BAD.keys())
def test_bad_input_is_refused_naming_the_fix(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        export(**fields)


def test_a_name_just_long_enough_passes_and_one_more_character_does_not():
    export(name="a" * (63 - len("-worker-9")), workers=10)
    with pytest.raises(ValueError, match="at most 54 characters"):
        export(name="a" * 55, workers=10)


def test_the_cli_writes_the_document_and_refuses_bad_input_in_one_line_with_exit_2(tmp_path):
    out = tmp_path / "job.yaml"
    done = subprocess.run(
        [
            LAUNCHER,
            "export",
            "mpijob",
            "--name",
            "digits",
            "--workers",
            "2",
            "--gpus-per-node",
            "2",
            "--env",
            "A=1",
            "--image",
            IMAGE,
            "--cpu",
            "2:4",
            "--memory",
            "8Gi",
            "--scheduler",
            "volcano",
            "--queue",
            "gpu",
            "--priority-class",
            "high",
            "--schedule-timeout",
            "600",
            "--deadline",
            "7200",
            "--suspend",
            "-o",
            str(out),
            "--",
            *TRAIN,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    document = yaml.safe_load(out.read_text())
    assert document["spec"]["slotsPerWorker"] == 2
    assert launcher_options(document).command == tuple(job_command(TRAIN))
    assert launcher_options(document).ready_timeout == 600
    assert document["spec"]["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "backoffLimit": 0,
        "activeDeadlineSeconds": 7200,
        "suspend": True,
        "schedulingPolicy": {"minAvailable": 3, "queue": "gpu", "priorityClass": "high"},
    }
    assert pods(document)[1]["containers"][0]["resources"]["limits"] == {"cpu": "4", "nvidia.com/gpu": 2}
    (tmp_path / ".env").write_text("IMAGE=ghcr.io/team/horovod-stack:latest\n")
    done = subprocess.run(
        [
            LAUNCHER,
            "export",
            "mpijob",
            "--name",
            "digits",
            "--workers",
            "2",
            "--ptrace",
            "--rdma",
            "--pod-security",
            "privileged",
            "--run-as-user",
            "platform",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    worker = pods(yaml.safe_load(done.stdout))[1]["containers"][0]
    assert (worker["image"], worker["imagePullPolicy"]) == ("ghcr.io/team/horovod-stack:latest", "Always")
    assert worker["securityContext"] == {"capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK", "SYS_PTRACE"]}}
    for args, message in (
        (["--name", "x_y", "--workers", "2"], "is not a DNS-1035 label"),
        (["--name", "x", "--workers", "0"], "needs at least 1 worker"),
        (["--name", "x", "--workers", "2", "--env", "NOPE"], "is not KEY=VALUE"),
        (["--name", "x", "--workers", "2", "--ptrace"], "--ptrace adds SYS_PTRACE"),
        (["--name", "x", "--workers", "2", "--min-workers", "1"], "elastic MPIJobs are not supported"),
    ):
        done = subprocess.run([LAUNCHER, "export", "mpijob", "--image", IMAGE, *args], capture_output=True, text=True)
        assert done.returncode == 2
        assert done.stdout == ""
        assert [line for line in done.stderr.splitlines() if line] == [done.stderr.strip()]
        assert done.stderr.startswith("error: ") and message in done.stderr


def test_docker_sizes_become_kubernetes_quantities():
    assert [mpijob_request.k8s_quantity(size) for size in ("1g", "512m", "64k", "1024", "2G")] == [
        "1Gi",
        "512Mi",
        "64Ki",
        "1024",
        "2Gi",
    ]
    with pytest.raises(ValueError, match="is not a number"):
        mpijob_request.k8s_quantity("1.5g")


# --- the launcher pod's side --------------------------------------------------------------------------------------
HOSTFILE = "digits-worker-0.digits.default.svc slots=2\ndigits-worker-1.digits.default.svc slots=2\n"


def test_agent_args_and_parse_agree():
    pod = PodArgs(
        name="j",
        options=JobOptions(
            network_interface="eth0",
            elastic=True,
            elastic_min_workers=2,
            env=("A=1", "B=x y"),
            command=("python", "-m", "app.train", "--epochs", "1"),
        ),
    )
    assert pod_contract.parse(pod_contract.agent_args(pod)) == pod
    unlimited = PodArgs(name="j", options=JobOptions(command=("true",), ready_timeout=math.inf, ptrace=False))
    assert pod_contract.agent_args(unlimited) == ["--job", "j", "--", "true"]
    assert pod_contract.parse(["--job", "j", "--", "true"]) == unlimited
    limited = PodArgs(name="j", options=JobOptions(command=("true",), ready_timeout=600))
    assert pod_contract.agent_args(limited) == ["--job", "j", "--schedule-timeout", "600", "--ptrace", "--", "true"]
    assert pod_contract.parse(pod_contract.agent_args(limited)) == limited
    with pytest.raises(SettingsError, match="written by `launcher export mpijob`"):
        pod_contract.parse(["--nope", "--", "true"])


def test_the_operators_hostfile_gives_the_workers_in_order_with_their_slots():
    assert mpijob_pod.hostfile_workers("# by the operator\n" + HOSTFILE) == [
        Worker("digits-worker-0", "digits-worker-0.digits.default.svc", 2),
        Worker("digits-worker-1", "digits-worker-1.digits.default.svc", 2),
    ]
    with pytest.raises(SettingsError, match="lists no workers"):
        mpijob_pod.hostfile_workers("\n")
    with pytest.raises(SettingsError, match="line 1: 'slots=two' is not slots=N"):
        mpijob_pod.hostfile_workers("w slots=two\n")


def test_the_job_runs_mpirun_over_the_operators_workers_with_a_run_folder_of_its_own():
    options = pod_contract.parse(["--job", "digits", "--env", "A=1", "--", "python", "-m", "app.train", *TRAIN])
    addresses = [("lo", "127.0.0.1/8"), ("eth0", "10.0.3.7/24"), ("docker0", "172.17.0.1/16")]
    spec = mpijob_pod.job_spec(options, HOSTFILE, addresses, now=0)
    assert spec.expected_workers == 2 and spec.slots == 2 and spec.agent_host is None
    assert spec.excluded_subnets == ("172.17.0.0/16",)  # a pod with host networking sees its node's docker0
    assert spec.run_dir and spec.run_dir.startswith("/shared/runs/digits-19700101-000000-")
    argv = spec.job_argv()
    assert argv[:5] == ["mpirun", "-np", "4", "--hostfile", "/home/mpiuser/hostfile"]
    assert "A=1" in argv and "--run-dir" in argv
    assert JobSpec.from_json(spec.to_json()) == spec
    user = mpijob_pod.job_spec(pod_contract.parse(["--", "python", "t.py"]), HOSTFILE, [], now=0)
    assert user.command == ("python", "t.py") and user.run_dir is None


def test_bad_launcher_arguments_are_refused_before_any_worker_is_claimed():
    with pytest.raises(
        SettingsError, match=re.escape("--min-workers 3 is not from 1 to the 2 worker pods (--workers)")
    ):
        pod = pod_contract.parse(["--min-workers", "3", "--network-interface", "eth0"])
        mpijob_pod.job_spec(pod, HOSTFILE, [])
    with pytest.raises(SettingsError, match="elastic training needs the NIC"):
        mpijob_pod.job_spec(pod_contract.parse(["--min-workers", "1"]), HOSTFILE, [])
    with pytest.raises(ValueError, match="is not KEY=VALUE"):
        pod_contract.parse(["--env", "oops"])


def test_ip_addresses_are_read_from_ip_o_addr():
    text = (
        "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n"
        "2: eth0    inet 10.0.3.7/24 brd 10.0.3.255 scope global eth0\\       valid_lft forever\n"
    )
    assert parse_ip_addresses(text) == [("lo", "127.0.0.1/8"), ("eth0", "10.0.3.7/24")]


def operator_transport(keys: dict[str, str]) -> StandInTransport:
    """The launcher pod's files and workers whose sshd answers the pinned key only."""
    transport = StandInTransport(keys=keys)
    transport.files[f"{MPIJOB_SSH_AUTH_DIR}/id_rsa"] = "the operator's key (a stand-in, no real key)\n"
    return transport


def test_the_agent_takes_the_operators_key_and_pins_each_workers_host_key_at_first_contact():
    keys = {"w0.j.ns.svc": "ssh-ed25519 AAA0", "w1.j.ns.svc": "ssh-ed25519 AAA1"}
    pinned = dict(keys)
    transport = operator_transport(pinned)
    scanned: list[str] = []

    def scan(address: str, port: int) -> str:
        scanned.append(address)
        return keys[address]

    spec = job_spec(
        job_id="j",
        command=("true",),
        expected_workers=2,
        workers=(Worker("w0", "w0.j.ns.svc"), Worker("w1", "w1.j.ns.svc")),
    )
    agent = operator_agent(
        spec,
        transport,
        MPIJOB_SSH_AUTH_DIR,  # type: ignore[arg-type]
        scan=scan,
        say=lambda _: None,
    )
    agent.prepare()
    assert transport.files[CLUSTER_KEY].startswith("the operator's key (a stand-in")
    assert transport.modes[CLUSTER_KEY] == 0o600
    assert [worker.name for worker in agent.wait_until_ready()] == ["w0", "w1"]
    assert transport.files[f"{HOSTKEYS_DIR}/w0.j.ns.svc.pub"] == "ssh-ed25519 AAA0\n"
    # Learnt once: from then on the pin is strict, as for published keys (and in elastic discovery, which reads it).
    pinned["w1.j.ns.svc"] = "ssh-ed25519 MALLORY"
    assert not agent.workers.answers(spec.workers[1])
    assert scanned == ["w0.j.ns.svc", "w1.j.ns.svc"]


def test_without_the_operators_key_the_job_is_refused_naming_the_mount():
    transport = operator_transport({})
    transport.files.clear()
    spec = job_spec(job_id="j", command=("true",), expected_workers=0)
    end = operator_agent(spec, transport, MPIJOB_SSH_AUTH_DIR, say=lambda _: None).run()  # type: ignore[arg-type]
    assert end.status == 2
    assert end.cause and f"no SSH key at {MPIJOB_SSH_AUTH_DIR}/id_rsa" in end.cause
    assert MPIJOB_HOSTFILE == "/etc/mpi/hostfile"


def test_an_elastic_job_discovers_its_workers_with_the_operators_script():
    options = pod_contract.parse(
        ["--job", "digits", "--min-workers", "1", "--network-interface", "eth0", "--", "python", "-m", "app.train"]
    )
    argv = " ".join(mpijob_pod.job_spec(options, HOSTFILE, [], now=0).job_argv())
    assert "horovodrun --gloo" in argv and "--host-discovery-script /etc/mpi/discover_hosts.sh " in argv
    assert "--slots-per-host 2 " in argv  # the operator's script names hosts without slots: the hostfile's


def test_the_pods_pass_the_profile_asked_for_and_no_stricter_one_than_needed():
    def strictest(**fields):
        return {strictest_profile(pod) for pod in pods(export(**fields))}

    assert strictest() == {"baseline"}
    assert strictest(pod_security="restricted") == {"restricted"}
    assert strictest(pod_security="privileged", ptrace=True) == {"privileged", "baseline"}  # the launcher adds none
