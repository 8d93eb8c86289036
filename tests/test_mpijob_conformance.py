"""The image meets the MPI Operator's run-time contract: an exported MPIJob's pods, run on two Docker hosts.

There is no Kubernetes here: this test plays the operator's part (../shared/k8s/README.md) on the two test hosts of
tests/multihost.py. It makes the operator's Secret (an ECDSA P-521 key pair and authorized_keys, root-owned, mode
0644, in a folder anyone may write, as a Secret volume is) and its ConfigMap (/etc/mpi/hostfile with the pods' DNS
names and slots; discover_hosts.sh), resolves the pods' DNS names (`<job>-worker-<i>.<job>.<ns>.svc`) to the hosts,
and runs each pod template's first container as the operator would have the kubelet run it: image, command, args,
env plus the operator's own, the template's volumes (the claim as one folder both hosts share, the shared memory),
the Secret at sshAuthMountPath, and the launcher only once every worker's readiness probe passes
(WaitForWorkersReady). Each pod has a network namespace and an address of its own, as in a cluster (a macvlan
network on each host's NIC), and its pod name as hostname; one worker per host, the launcher beside worker 0.
The launcher container's exit status must be the job's.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest
import yaml

from tests.multihost import NIC, SUBNET, Cluster, TestNode, started_cluster

pytestmark = pytest.mark.integration

IMAGE = os.environ.get("IMAGE", "horovod-stack:latest")
LAUNCHER = str(Path(sys.executable).parent / "launcher")
NAMESPACE = "default"
LABEL = "horovod-stack.test-mpijob"
POD_NETWORK = "mpijob-pods"
LAUNCHER_POD_ADDRESS = f"{SUBNET}.130"
"""Worker i's pod has .131+i; the node engines' IPAM hands out nothing below .128."""


@pytest.fixture(scope="module")
def cluster():
    with started_cluster(2) as harness:
        for node in harness.nodes:
            print(f"\nimage loaded on {node.name} in {harness.load_image(IMAGE, node):.0f} s")
        yield harness


@pytest.fixture(scope="module")
def pod_network(cluster):
    """On each host, a network whose containers get addresses of their own on the hosts' subnet."""
    made = []
    try:
        for node in cluster.nodes:
            pool = docker.types.IPAMPool(subnet=f"{SUBNET}.0/24", gateway=f"{SUBNET}.1", iprange=f"{SUBNET}.128/25")
            made.append(node.client().networks.create(POD_NETWORK, driver="macvlan", options={"parent": NIC},
                                                      ipam=docker.types.IPAMConfig(pool_configs=[pool])))
        yield POD_NETWORK
    finally:
        for network in made:
            network.remove()


def export(name: str, *args: str) -> dict:
    done = subprocess.run([LAUNCHER, "export", "mpijob", "--name", name, "--image", IMAGE, *args],
                          capture_output=True, text=True, check=True)
    return yaml.safe_load(done.stdout)


def docker_size(quantity: str) -> str:
    return quantity.replace("Gi", "g").replace("Mi", "m").replace("Ki", "k")


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
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-m", "PEM", "-N", "", "-C", "",
                        "-f", str(self.secret / "id_rsa")], check=True)
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
            "".join(f"{self.worker_host(i)} slots={slots}\n" for i in range(self.workers)))
        (self.config / "discover_hosts.sh").write_text(
            "#!/bin/sh\n" + "".join(f"echo {self.worker_host(i)}\n" for i in range(self.workers)))
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
            env |= {"OMPI_MCA_orte_keep_fqdn_hostnames": "true", "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
                    "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
                    "OMPI_MCA_orte_set_default_slots": str(self.spec.get("slotsPerWorker", 1)),
                    "NVIDIA_VISIBLE_DEVICES": "", "NVIDIA_DRIVER_CAPABILITIES": ""}
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
        capabilities = container.get("securityContext", {}).get("capabilities", {}).get("add", [])
        limits = container.get("resources", {}).get("limits", {})
        assert not limits or replica == "Worker", "GPUs on the workers only"
        started = node.client().containers.run(
            container["image"], entrypoint=container.get("command"), command=container.get("args"),
            environment=env, volumes=binds, shm_size=shm_size, cap_add=capabilities, hostname=pod_name,
            network=POD_NETWORK, networking_config={POD_NETWORK: node.client().api.create_endpoint_config(
                ipv4_address=address)}, extra_hosts=self.dns(),
            user=f"{security.get('runAsUser', 1000)}:{security.get('runAsGroup', 1000)}",
            group_add=[str(security["fsGroup"])] if "fsGroup" in security else None, name=pod_name,
            labels={LABEL: self.name}, detach=True)
        self.pods.append((node, pod_name))
        return started

    def ready(self, address: str, container, probe: dict, timeout: float = 120) -> float:
        """The readiness probe (tcpSocket) from outside the pod, as the kubelet makes it."""
        started = time.monotonic()
        while True:
            try:
                with socket.create_connection((address, probe["tcpSocket"]["port"]), timeout=2):
                    return time.monotonic() - started
            except OSError as error:
                container.reload()
                if container.status != "running" or time.monotonic() - started > timeout:
                    raise AssertionError(f"{container.name}: the worker's readiness probe never passed ({error}; "
                                         f"{container.status}): {container.logs().decode()[-3000:]}") from None
                time.sleep(probe.get("periodSeconds", 10) / 2)

    def run(self, timeout: float = 600) -> tuple[int, str, list[tuple[str, int, str]]]:
        """The MPIJob: workers, then (WaitForWorkersReady) the launcher; its exit status and log, and how each worker
        ended (cleanPodPolicy Running: one still running once the launcher ended is removed)."""
        worker_probe = self.spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["readinessProbe"]
        workers = [self.run_pod(self.cluster.nodes[i], "Worker", f"{self.name}-worker-{i}", self.worker_address(i))
                   for i in range(self.workers)]
        assert self.spec["launcherCreationPolicy"] == "WaitForWorkersReady"
        for index in range(self.workers):
            self.ready(self.worker_address(index), workers[index], worker_probe)
        launcher = self.run_pod(self.cluster.nodes[0], "Launcher", f"{self.name}-launcher", LAUNCHER_POD_ADDRESS)
        status = launcher.wait(timeout=timeout)["StatusCode"]
        log = launcher.logs().decode(errors="replace")
        ended = []
        deadline = time.monotonic() + 30  # the workers stop by themselves once told that the job ended
        for worker in workers:
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
    leftover = {node.name: [c.name for c in node.client().containers.list(all=True, filters={"label": LABEL})]
                for node in cluster.nodes}
    assert leftover == {node.name: [] for node in cluster.nodes}


def test_an_exported_mpijob_trains_across_both_hosts_and_the_launcher_exits_with_the_jobs_status(operator):
    document = export("conformance", "--workers", "2", "--", "--dataset", "digits", "--epochs", "5",
                      "--summary-file", "/shared/summary.json")
    job = operator(document)
    started = time.monotonic()
    status, log, workers = job.run()
    print(f"\nMPIJob conformance: launcher exit status {status} after {time.monotonic() - started:.0f} s\n"
          + "\n".join(line for line in log.splitlines() if line.startswith("[agent ")))
    assert status == 0, log[-6000:]
    hosts = "conformance-worker-0.conformance.default.svc:1 conformance-worker-1.conformance.default.svc:1"
    for line in ("conformance-worker-0: sshd answers on port 12345", "conformance-worker-1: sshd answers on port 12345",
                 f"hostfile: {hosts}",
                 "running: mpirun -np 2 --hostfile /home/mpiuser/hostfile", "parameters identical on all 2 ranks",
                 "job succeeded (exit status 0)", "results: /shared/runs/conformance-"):
        assert line in log, log[-6000:]
    summary = json.loads((job.claim / "summary.json").read_text())
    assert summary["final"]["val_accuracy"] >= 0.90
    # Rank 0 in worker 0's pod (on node_1), rank 1 in worker 1's (on node_2): across both hosts.
    assert [rank["addresses"] for rank in summary["ranks"]] == [[job.worker_address(0)], [job.worker_address(1)]]
    runs = [path.name for path in (job.claim / "runs").iterdir()]
    assert "latest" in runs and any(name.startswith("conformance-") for name in runs)
    for name, code, worker_log in workers:
        assert code == 0, f"{name}: {worker_log[-2000:]}"
        assert "the job ended (exit status 0); stopping" in worker_log


def test_a_users_failing_command_is_the_launcher_pods_exit_status(operator):
    document = export("conformance-fail", "--workers", "2", "--slots", "2", "--env", "EXIT_WITH=3", "--",
                      "python", "-c", "import os, sys; sys.exit(int(os.environ['EXIT_WITH']))")
    status, log, workers = operator(document).run(timeout=300)
    print(f"\nMPIJob conformance (failing command): launcher exit status {status}")
    assert status == 3, log[-4000:]
    assert "running: mpirun -np 4 --hostfile /home/mpiuser/hostfile" in log
    assert "job FAILED (exit status 3)" in log, log[-4000:]
    assert [code for _, code, _ in workers] == [0, 0]
