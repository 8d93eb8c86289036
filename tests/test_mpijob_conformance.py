"""The image meets the MPI Operator's run-time contract: an exported MPIJob's pods, run on two Docker hosts.

There is no Kubernetes here: this test plays the operator's part (../shared/k8s/README.md) on the two test hosts of
tests/multihost.py. It makes the operator's Secret (an ECDSA P-521 key pair and authorized_keys, root-owned, mode
0644, in a folder anyone may write, as a Secret volume is) and its ConfigMap (/etc/mpi/hostfile with the pods' DNS
names and slots; discover_hosts.sh), resolves the pods' DNS names (`<job>-worker-<i>.<job>.<ns>.svc`) to the hosts,
and runs each pod template's first container as the operator would have the kubelet run it: image, command, args,
env plus the operator's own, the template's volumes (the claim as one folder both hosts share, the shared memory),
the Secret at sshAuthMountPath, its security context (capabilities dropped and added, no new privileges), its
limits, and its exec readiness probe; the launcher with the workers (launcherCreationPolicy AtStartup). Each pod
has a network namespace and an address of its own, as in a cluster (a macvlan network on each host's NIC), and its
pod name as hostname; one worker per host, the launcher beside worker 0. The launcher container's exit status must
be the job's. A worker pod may start late (a GPU queue without a gang scheduler) or never (the job's
--schedule-timeout then ends it).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest
import yaml

from tests.multihost import NIC, Cluster, Network, TestNode

pytestmark = pytest.mark.integration

IMAGE = os.environ.get("IMAGE", "horovod-stack:latest")
REGISTRY_IMAGE = "registry.test/horovod-stack:conformance"
"""The image as the export names it: every test host has IMAGE under this name too, as if pulled from a registry."""
LATE_SECONDS = 20
"""How late worker 1's pod starts in the training run: no claim timeout may stop worker 0 meanwhile."""
LAUNCHER = str(Path(sys.executable).parent / "launcher")
NAMESPACE = "default"
LABEL = "horovod-stack.test-mpijob"
POD_NETWORK = "mpijob-pods"
SUBNET = Network().subnet
"""The shared test hosts' subnet (tests/conftest.py's test_hosts), where the pods get addresses too."""
LAUNCHER_POD_ADDRESS = f"{SUBNET}.130"
"""Worker i's pod has .131+i; the node engines' IPAM hands out nothing below .128."""


@pytest.fixture(scope="module")
def cluster(test_hosts: Cluster):
    """The shared test hosts, each with the image, also under the name the export gives it."""
    for node in test_hosts.nodes:
        test_hosts.ensure_image(IMAGE, node)
        node.client().images.get(IMAGE).tag(REGISTRY_IMAGE)
    return test_hosts


@pytest.fixture(scope="module")
def pod_network(cluster):
    """On each host, a network whose containers get addresses of their own on the hosts' subnet."""
    made = []
    try:
        for node in cluster.nodes:
            pool = docker.types.IPAMPool(subnet=f"{SUBNET}.0/24", gateway=f"{SUBNET}.1", iprange=f"{SUBNET}.128/25")
            made.append(
                node.client().networks.create(
                    POD_NETWORK,
                    driver="macvlan",
                    options={"parent": NIC},
                    ipam=docker.types.IPAMConfig(pool_configs=[pool]),
                )
            )
        yield POD_NETWORK
    finally:
        for network in made:
            network.remove()


def export(name: str, *args: str) -> dict:
    done = subprocess.run(
        [LAUNCHER, "export", "mpijob", "--name", name, "--image", REGISTRY_IMAGE, *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return yaml.safe_load(done.stdout)


def docker_size(quantity: str) -> str:
    return quantity.replace("Gi", "g").replace("Mi", "m").replace("Ki", "k")


def nano_cpus(quantity: str) -> int:
    return int(float(quantity[:-1]) * 1e6) if quantity.endswith("m") else int(float(quantity) * 1e9)


class Operator:
    """The MPI Operator's part for one MPIJob, on the test hosts: its Secret, ConfigMap, DNS names and pods."""

    def __init__(self, cluster: Cluster, document: dict) -> None:
        self.cluster, self.document = cluster, document
        self.name = document["metadata"]["name"]
        self.spec = document["spec"]
        self.root = cluster.root / f"operator-{self.name}"
        self.workers = self.spec["mpiReplicaSpecs"]["Worker"]["replicas"]
        assert self.workers <= len(cluster.nodes)
        self.pods: list[tuple[TestNode, str]] = []
        self.root.mkdir()
        self.secret, self.config, self.claim = self.root / "ssh-auth", self.root / "mpi", self.root / "claim"
        self.make_secret()
        self.make_config()
        self.claim.mkdir()
        os.chown(self.claim, 1000, 1000)  # a claim the pods' fsGroup can write

    def worker_host(self, index: int) -> str:
        return f"{self.name}-worker-{index}.{self.name}.{NAMESPACE}.svc"

    @staticmethod
    def worker_address(index: int) -> str:
        return f"{SUBNET}.{131 + index}"

    def make_secret(self) -> None:
        """`<job>-ssh`: an ECDSA P-521 key, as the operator makes it; root-owned files of mode 0644 in a folder of
        mode 1777 (how the kubelet mounts a Secret anywhere but /root/.ssh)."""
        self.secret.mkdir()
        subprocess.run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ecdsa",
                "-b",
                "521",
                "-m",
                "PEM",
                "-N",
                "",
                "-C",
                "",
                "-f",
                str(self.secret / "id_rsa"),
            ],
            check=True,
        )
        shutil.copy(self.secret / "id_rsa.pub", self.secret / "authorized_keys")
        for path in self.secret.iterdir():
            os.chown(path, 0, 0)
            path.chmod(0o644)
        self.secret.chmod(0o1777)

    def make_config(self) -> None:
        """`<job>-config`: the hostfile (OpenMPI lines) and discover_hosts.sh, mounted on the launcher at /etc/mpi."""
        self.config.mkdir()
        slots = self.spec.get("slotsPerWorker", 1)
        (self.config / "hostfile").write_text(
            "".join(f"{self.worker_host(i)} slots={slots}\n" for i in range(self.workers))
        )
        (self.config / "discover_hosts.sh").write_text(
            "#!/bin/sh\n" + "".join(f"echo {self.worker_host(i)}\n" for i in range(self.workers))
        )
        (self.config / "discover_hosts.sh").chmod(0o755)

    def dns(self) -> dict[str, str]:
        """The pods' names as the cluster's DNS answers them (FQDN-ish, and the short forms the search list
        completes), here through each container's /etc/hosts."""
        names = {}
        for index in range(self.workers):
            address = self.worker_address(index)
            pod = f"{self.name}-worker-{index}"
            for name in (self.worker_host(index), f"{pod}.{self.name}", pod):
                names[name] = address
        return names

    def operator_env(self, role: str) -> dict[str, str]:
        env = {"K_MPI_JOB_ROLE": role}
        if role == "launcher":
            env |= {
                "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
                "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
                "OMPI_MCA_orte_set_default_slots": str(self.spec.get("slotsPerWorker", 1)),
                "NVIDIA_VISIBLE_DEVICES": "",
                "NVIDIA_DRIVER_CAPABILITIES": "",
            }
        return env

    def run_pod(self, node: TestNode, replica: str, pod_name: str, address: str):
        """The template's first container as the kubelet would start it (as far as a Docker engine can)."""
        pod = self.spec["mpiReplicaSpecs"][replica]["template"]["spec"]
        container = pod["containers"][0]
        volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
        binds, shm_size = {str(self.secret): {"bind": self.spec["sshAuthMountPath"], "mode": "ro"}}, None
        if replica == "Launcher":
            binds[str(self.config)] = {"bind": "/etc/mpi", "mode": "ro"}
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "persistentVolumeClaim" in volume:
                binds[str(self.claim)] = {"bind": mount["mountPath"], "mode": "rw"}
            elif volume.get("emptyDir", {}).get("medium") == "Memory" and mount["mountPath"] == "/dev/shm":
                shm_size = docker_size(volume["emptyDir"]["sizeLimit"])
            else:
                raise AssertionError(f"no emulation for volume {volume}")
        env = {item["name"]: item["value"] for item in container.get("env", [])}
        env |= self.operator_env(replica.lower())
        security = pod.get("securityContext", {})
        context = container.get("securityContext", {})
        capabilities = context.get("capabilities", {})
        limits = container.get("resources", {}).get("limits", {})
        assert "nvidia.com/gpu" not in limits or replica == "Worker", "GPUs on the workers only"
        started = node.client().containers.run(
            container["image"],
            entrypoint=container.get("command"),
            command=container.get("args"),
            environment=env,
            volumes=binds,
            shm_size=shm_size,
            cap_add=capabilities.get("add"),
            cap_drop=capabilities.get("drop"),
            hostname=pod_name,
            security_opt=["no-new-privileges"] if context.get("allowPrivilegeEscalation") is False else None,
            mem_limit=docker_size(limits["memory"]) if "memory" in limits else None,
            nano_cpus=nano_cpus(str(limits["cpu"])) if "cpu" in limits else None,
            network=POD_NETWORK,
            networking_config={POD_NETWORK: node.client().api.create_endpoint_config(ipv4_address=address)},
            extra_hosts=self.dns(),
            user=f"{security.get('runAsUser', 1000)}:{security.get('runAsGroup', 1000)}",
            group_add=[str(security["fsGroup"])] if "fsGroup" in security else None,
            name=pod_name,
            labels={LABEL: self.name},
            detach=True,
        )
        self.pods.append((node, pod_name))
        return started

    @staticmethod
    def probe(container, probe: dict) -> bool:
        """The readiness probe (exec), as the kubelet runs it: its command in the container, as its user."""
        try:
            return container.exec_run(probe["exec"]["command"]).exit_code == 0
        except docker.errors.APIError:  # the container is not running (any more): ready() says how it ended
            return False

    def ready(self, container, probe: dict, timeout: float = 120) -> float:
        """Seconds until the worker's readiness probe passes."""
        started = time.monotonic()
        while not self.probe(container, probe):
            container.reload()
            if container.status != "running" or time.monotonic() - started > timeout:
                raise AssertionError(
                    f"{container.name}: the worker's readiness probe never passed "
                    f"({container.status}): {container.logs().decode()[-3000:]}"
                )
            time.sleep(probe.get("periodSeconds", 10) / 2)
        return time.monotonic() - started

    def run(
        self, timeout: float = 600, late: dict[int, float] | None = None, while_late=None
    ) -> tuple[int, str, list[tuple[str, int, str]]]:
        """The MPIJob: the workers and the launcher at once (AtStartup), worker i `late[i]` seconds later (never, for
        math.inf); `while_late(workers, launcher)` runs meanwhile. The launcher's exit status and log, and how each
        worker that started ended (cleanPodPolicy Running: one still running once the launcher ended is removed)."""
        late, started = late or {}, time.monotonic()
        probe = self.spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["readinessProbe"]
        assert self.spec["launcherCreationPolicy"] == "AtStartup"
        on_time = [i for i in range(self.workers) if i not in late]
        workers = {
            i: self.run_pod(self.cluster.nodes[i], "Worker", f"{self.name}-worker-{i}", self.worker_address(i))
            for i in on_time
        }
        launcher = self.run_pod(self.cluster.nodes[0], "Launcher", f"{self.name}-launcher", LAUNCHER_POD_ADDRESS)
        for index in on_time:
            self.ready(workers[index], probe)
        if while_late:
            while_late(workers, launcher)
        for index, seconds in sorted(late.items(), key=lambda item: item[1]):
            if seconds != math.inf:
                time.sleep(max(0.0, seconds - (time.monotonic() - started)))
                workers[index] = self.run_pod(
                    self.cluster.nodes[index], "Worker", f"{self.name}-worker-{index}", self.worker_address(index)
                )
                self.ready(workers[index], probe)
        status = launcher.wait(timeout=timeout)["StatusCode"]
        log = launcher.logs().decode(errors="replace")
        ended = []
        deadline = time.monotonic() + 30  # the workers stop by themselves once told that the job ended
        for worker in workers.values():
            try:
                code = worker.wait(timeout=max(1.0, deadline - time.monotonic()))["StatusCode"]
            except Exception:  # still running: the operator's cleanPodPolicy Running removes it
                code = -1
            ended.append((worker.name, code, worker.logs().decode(errors="replace")))
        return status, log, ended

    def remove(self) -> None:
        for node, pod_name in self.pods:
            try:
                node.client().containers.get(pod_name).remove(force=True)
            except Exception:
                pass
        self.pods.clear()


@pytest.fixture
def operator(cluster, pod_network):
    made: list[Operator] = []

    def make(document: dict) -> Operator:
        made.append(Operator(cluster, document))
        return made[-1]

    yield make
    for each in made:
        each.remove()
    leftover = {
        node.name: [c.name for c in node.client().containers.list(all=True, filters={"label": LABEL})]
        for node in cluster.nodes
    }
    assert leftover == {node.name: [] for node in cluster.nodes}


def sshd_lines(container) -> list[str]:
    return [line for line in container.logs().decode(errors="replace").splitlines() if not line.startswith("[")]


def test_an_exported_mpijob_trains_across_both_hosts_and_the_launcher_exits_with_the_jobs_status(operator, measured):
    """Worker 1's pod starts LATE_SECONDS after the others (its node busy, a queue): worker 0 waits for its claim
    unclaimed all that while, and its exec readiness probe leaves no line in its log."""
    document = export(
        "conformance",
        "--workers",
        "2",
        "--",
        "--dataset",
        "digits",
        "--epochs",
        "5",
        "--summary-file",
        "/shared/summary.json",
    )
    job = operator(document)
    quiet: list[tuple[list[str], list[str]]] = []

    def probe_worker_0(workers, launcher):
        deadline = time.monotonic() + 60
        while "conformance-worker-0: sshd answers" not in launcher.logs().decode(errors="replace"):
            assert time.monotonic() < deadline, launcher.logs().decode(errors="replace")[-3000:]
            time.sleep(0.5)
        probe = document["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["readinessProbe"]
        before, settled = sshd_lines(workers[0]), time.monotonic() + 10
        while time.monotonic() < settled:  # the agent's ssh session's last lines (a disconnect) come just after it
            time.sleep(1)
            if (now := sshd_lines(workers[0])) == before:
                break
            before = now
        assert all(job.probe(workers[0], probe) for _ in range(5))
        quiet.append((before, sshd_lines(workers[0])))

    started = time.monotonic()
    status, log, workers = job.run(late={1: LATE_SECONDS}, while_late=probe_worker_0)
    measured(
        f"MPIJob conformance: worker 1 started {LATE_SECONDS} s late; launcher exit status {status} after "
        f"{time.monotonic() - started:.0f} s"
    )
    print("\n".join(line for line in log.splitlines() if line.startswith("[agent ")))
    assert status == 0, log[-6000:]
    [(before, after)] = quiet
    assert after == before, f"the readiness probe left sshd lines: {after[len(before) :]}"
    hosts = "conformance-worker-0.conformance.default.svc:1 conformance-worker-1.conformance.default.svc:1"
    for line in (
        "conformance-worker-0: sshd answers on port 12345 (1/2 workers",
        "conformance-worker-1: sshd answers on port 12345 (2/2 workers",
        f"hostfile: {hosts}",
        "running: mpirun -np 2 --hostfile /home/mpiuser/hostfile",
        "parameters identical on all 2 ranks",
        "job succeeded (exit status 0)",
        "results: /shared/runs/conformance-",
    ):
        assert line in log, log[-6000:]
    summary = json.loads((job.claim / "summary.json").read_text())
    assert summary["final"]["val_accuracy"] >= 0.90
    # Rank 0 in worker 0's pod (on node_1), rank 1 in worker 1's (on node_2): across both hosts.
    assert [rank["addresses"] for rank in summary["ranks"]] == [[job.worker_address(0)], [job.worker_address(1)]]
    runs = [path.name for path in (job.claim / "runs").iterdir()]
    assert "latest" in runs and any(name.startswith("conformance-") for name in runs)
    for name, code, worker_log in workers:
        assert code == 0, f"{name}: {worker_log[-2000:]}"
        assert "waiting for a job's claim" in worker_log and "no job claimed" not in worker_log
        assert "the job ended (exit status 0); stopping" in worker_log


def test_a_worker_that_never_starts_fails_the_job_after_its_schedule_timeout(operator, measured):
    """--schedule-timeout: the launcher pod's agent gives up on a worker pod that never starts (a GPU queue that
    never frees one), so the launcher's Job fails and the MPIJob with it, instead of waiting in Created for good."""
    document = export("conformance-late", "--workers", "2", "--schedule-timeout", "15", "--", "python", "-c", "pass")
    started = time.monotonic()
    status, log, workers = operator(document).run(timeout=300, late={1: math.inf})
    measured(
        f"MPIJob conformance (a worker that never starts, --schedule-timeout 15): launcher exit status {status} "
        f"after {time.monotonic() - started:.0f} s"
    )
    print("\n".join(line for line in log.splitlines() if line.startswith("[agent ")))
    assert status == 2, log[-4000:]
    assert (
        "only 1 of 2 workers answered ssh on port 12345 within 15 s (still waiting for conformance-late-worker-1)"
        in log
    ), log[-4000:]
    assert [code for _, code, _ in workers] == [0]  # worker 0 was told, and stopped
    assert "the job ended (exit status 2: only 1 of 2 workers" in workers[0][2]


def test_a_users_failing_command_is_the_launcher_pods_exit_status(operator):
    document = export(
        "conformance-fail",
        "--workers",
        "2",
        "--slots",
        "2",
        "--env",
        "EXIT_WITH=3",
        "--",
        "python",
        "-c",
        "import os, sys; sys.exit(int(os.environ['EXIT_WITH']))",
    )
    status, log, workers = operator(document).run(timeout=300)
    print(f"\nMPIJob conformance (failing command): launcher exit status {status}")
    assert status == 3, log[-4000:]
    assert "running: mpirun -np 4 --hostfile /home/mpiuser/hostfile" in log
    assert "job FAILED (exit status 3)" in log, log[-4000:]
    assert [code for _, code, _ in workers] == [0, 0]
