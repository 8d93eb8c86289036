"""The launch's checks before any worker starts, against stand-in drivers (no Docker)."""

import dataclasses

import pytest

from app import gpu
from launcher import session
from launcher.driver import HostView
from launcher.plan import Node
from launcher.settings import LaunchSettings


HOSTS = {"node_1": "10.0.0.1", "node_2": "10.0.0.2"}


class StandInDriver:
    def __init__(self, name: str, nics: tuple[str, ...], port_taken: bool = False, gpu_query: str = "",
                 addresses: tuple[tuple[str, str], ...] = ()) -> None:
        self.node = Node(name, f"ssh://{name}")
        self.gpu_query = gpu_query
        self.view = HostView(port_taken=port_taken, nics=nics, addresses=addresses)
        self.started = []
        self.gpu_requests = []

    def cluster_containers(self, cluster_id=None):
        return []

    def image_id(self, image):
        return "sha256:0123456789abcdef"

    def host_view(self, image, port, resolve=()):
        # As /etc/hosts on every node would: the test nodes resolve, other names do not.
        return dataclasses.replace(self.view, resolved=tuple((name, HOSTS[name]) for name in resolve if name in HOSTS))

    def gpu_problem(self, image, request):
        self.gpu_requests.append(request)
        return gpu.gpu_problem(self.gpu_query, len(request.device_ids) or request.count)

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
        assert "node_2: port 12345 free" + (f", NIC {nic} present" if nic else "") in said
        return
    with pytest.raises(session.LaunchError) as refused:
        session.launch(settings, say=said.append, relay=said.append)
    assert str(refused.value).startswith(error)
    assert [d.started for d in drivers] == [[], []]


H100 = "0, NVIDIA H100 80GB HBM3, 580.65.06, 9.0\n1, NVIDIA H100 80GB HBM3, 580.65.06, 9.0\n"


@pytest.mark.parametrize("query, wanted, problem", [
    (H100, 2, None),
    (H100, 4, "only 2 GPU(s) visible to a container there, 4 asked for; pass a smaller --gpus"),
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


def test_gpus_named_by_id_are_checked_with_the_workers_own_request(monkeypatch):
    drivers = [StandInDriver("node_1", ("lo",), gpu_query=H100), StandInDriver("node_2", ("lo",), gpu_query=H100)]
    settings = LaunchSettings(nodes=("node_1", "node_2"), gpus_per_node=2, gpu_ids=("0", "1"))
    session.check_nodes(settings.plan(), drivers, push_image=False, say=lambda _: None)
    plan = settings.plan()
    assert [request for driver in drivers for request in driver.gpu_requests] == [plan.gpu_request(plan.rank0)] * 2
    assert plan.gpu_request(plan.rank0).device_ids == ("0", "1")


@pytest.mark.parametrize("nic, nodes, expected", [
    (None, ("node_1", "node_2"), ("172.17.0.0/16", "172.26.0.0/16")),
    ("eth0", ("node_1", "node_2"), ()),   # a pinned NIC needs no exclusion
    (None, ("node_1",), ()),              # one host: ranks do not cross hosts
])
def test_an_unpinned_nic_across_hosts_leaves_every_nodes_virtual_subnets_out(nic, nodes, expected):
    node_1 = (("lo", "127.0.0.1/8"), ("eth0", "10.0.0.1/24"), ("docker0", "172.17.0.1/16"))
    node_2 = (("lo", "127.0.0.1/8"), ("eth0", "10.0.0.2/24"), ("docker0", "172.17.0.1/16"),
              ("br-c33e5cb9fa8c", "172.26.0.1/16"))
    drivers = [StandInDriver("node_1", ("lo", "eth0", "docker0"), addresses=node_1),
               StandInDriver("node_2", ("lo", "eth0", "docker0", "br-c33e5cb9fa8c", "veth9a1"), addresses=node_2)]
    plan = LaunchSettings(nodes=nodes, network_interface=nic).plan()
    checked = session.check_nodes(plan, drivers[: len(nodes)], push_image=False, say=lambda _: None)
    assert checked.excluded_subnets == expected
    assert checked.job_spec().excluded_subnets == expected
