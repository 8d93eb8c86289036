"""The launch's checks before any worker starts, against stand-in drivers (no Docker)."""

import pytest

from app import gpu
from launcher import session
from launcher.driver import HostView
from launcher.plan import Node
from launcher.settings import LaunchSettings


class StandInDriver:
    def __init__(self, name: str, nics: tuple[str, ...], port_taken: bool = False, gpu_query: str = "") -> None:
        self.node = Node(name, f"ssh://{name}")
        self.gpu_query = gpu_query
        self.view = HostView(port_taken=port_taken, nics=nics)
        self.started = []

    def cluster_containers(self, cluster_id=None):
        return []

    def image_id(self, image):
        return "sha256:0123456789abcdef"

    def host_view(self, image, port):
        return self.view

    def gpu_problem(self, image, gpus):
        return gpu.gpu_problem(self.gpu_query, gpus)

    def start_worker(self, plan):
        self.started.append(plan.cluster_id)
        raise AssertionError("a worker started")


@pytest.mark.parametrize("nic, node_2_nics, port_taken, error", [
    ("ens5", ("lo", "ens5", "docker0"), False, None),
    (None, ("lo", "eth0"), False, None),
    ("ens5", ("lo", "eth0", "docker0"), False, "node_2: no network interface ens5 there (it has docker0, eth0, lo); "
                                               "pass --network-interface with one of them, or set "
                                               "NODE_NETWORK_INTERFACE in .env"),
    ("ens5", ("lo", "ens5"), True, "node_2: port 12345 is already in use there"),
])
def test_nic_and_port_are_checked_before_any_worker_starts(nic, node_2_nics, port_taken, error, monkeypatch):
    drivers = [StandInDriver("node_1", ("lo", "ens5")), StandInDriver("node_2", node_2_nics, port_taken)]
    monkeypatch.setattr(session, "connect_all", lambda plan, say: drivers)
    said = []
    settings = LaunchSettings(nodes=("node_1", "node_2"), network_interface=nic)
    if error is None:
        session.check_nodes(settings.plan(), drivers, push_image=False, say=said.append)
        assert said[-1] == "node_2: port 12345 free" + (f", NIC {nic} present" if nic else "")
        return
    with pytest.raises(session.LaunchError) as refused:
        session.launch(settings, say=said.append, relay=said.append)
    assert str(refused.value).startswith(error)
    assert [d.started for d in drivers] == [[], []]


H100 = "0, NVIDIA H100 80GB HBM3, 580.65.06, 9.0\n1, NVIDIA H100 80GB HBM3, 580.65.06, 9.0\n"


@pytest.mark.parametrize("query, wanted, problem", [
    (H100, 2, None),
    (H100, 4, "only 2 GPU(s) visible to a container there, 4 asked for; pass a smaller --gpus-per-node"),
    ("0, NVIDIA A100-SXM4-40GB, 550.54.15, 8.0\n", 1, "NVIDIA driver 550.54.15 is older than 580"),
    ("0, Tesla V100-SXM2-16GB, 580.65.06, 7.0\n", 1, "GPU 0 (Tesla V100-SXM2-16GB) has compute capability 7.0; "
                                                     "CUDA 13 needs 7.5 or higher"),
    ("0, Odd GPU, [N/A], [N/A]\n", 1, "nvidia-smi's answer there could not be read"),
])
def test_gpus_are_checked_on_every_node_before_any_worker_starts(query, wanted, problem, monkeypatch):
    drivers = [StandInDriver("node_1", ("lo",), gpu_query=H100 * 2), StandInDriver("node_2", ("lo",), gpu_query=query)]
    monkeypatch.setattr(session, "connect_all", lambda plan, say: drivers)
    settings = LaunchSettings(nodes=("node_1", "node_2"), gpus_per_node=wanted if problem else 2)
    if problem is None:
        session.check_nodes(settings.plan(), drivers, push_image=False, say=lambda _: None)
        return
    with pytest.raises(session.LaunchError) as refused:
        session.launch(settings, say=lambda _: None, relay=lambda _: None)
    assert str(refused.value).startswith(f"node_2: {problem}")
    assert [d.started for d in drivers] == [[], []]
