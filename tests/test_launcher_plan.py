"""The launch plan and settings: pure, table-driven."""

import dataclasses
from pathlib import Path

import pytest

from launcher.plan import ClusterPlan, Node, mpi_host
from launcher.settings import LaunchSettings, SettingsError, engine_override_key, load_env_file, resolve_settings


def make_plan(**overrides) -> ClusterPlan:
    return LaunchSettings(**{"nodes": ("gpu-a", "gpu-b"), **overrides}).plan(cluster_id="c0ffee00")


@pytest.mark.parametrize("settings, hostfile", [
    ({}, "gpu-a slots=1\ngpu-b slots=1\n"),
    ({"slots": 3}, "gpu-a slots=3\ngpu-b slots=3\n"),
    ({"gpus_per_node": 4, "slots": 2}, "gpu-a slots=4\ngpu-b slots=4\n"),  # one rank per GPU
    ({"nodes": ("a.lan",)}, "a.lan slots=1\n"),
])
def test_hostfile(settings, hostfile):
    assert make_plan(**settings).hostfile() == hostfile


@pytest.mark.parametrize("name, address, expected", [
    ("gpu-a", None, "gpu-a"),
    ("gpu-a.lan", "10.0.0.1", "gpu-a.lan"),
    ("node_1", "10.0.0.1", "10.0.0.1"),   # Open MPI refuses underscores in host names
])
def test_mpi_host(name, address, expected):
    assert mpi_host(name, address) == expected


def test_underscored_nodes_go_to_mpirun_by_address():
    plan = LaunchSettings(nodes=("node_1", "node_2")).plan(cluster_id="c0ffee00")
    assert [node.name for node in plan.needs_addresses()] == ["node_1", "node_2"]
    with pytest.raises(ValueError, match="node_1 needs an address"):
        plan.hostfile()
    plan = dataclasses.replace(plan, addresses=(("node_1", "10.0.0.1"), ("node_2", "10.0.0.2")))
    assert plan.hostfile() == "10.0.0.1 slots=1\n10.0.0.2 slots=1\n"
    assert plan.known_hosts({"node_1": "ssh-ed25519 K1", "node_2": "ssh-ed25519 K2"}) == (
        "[10.0.0.1]:12345 ssh-ed25519 K1\n[10.0.0.2]:12345 ssh-ed25519 K2\n")


def test_mpirun_argv_carries_the_seed_flags_and_trainer_args():
    argv = make_plan(slots=2, trainer_args=("--dataset", "digits")).mpirun_argv()
    assert argv[:5] == ["mpirun", "-np", "4", "--hostfile", "/home/mpiuser/hostfile"]
    assert argv[5:9] == ["-bind-to", "none", "-map-by", "slot"]
    assert ["-x", "NCCL_DEBUG=INFO"] == argv[argv.index("NCCL_DEBUG=INFO") - 1:argv.index("NCCL_DEBUG=INFO") + 1]
    assert argv[-5:] == ["python", "-m", "app.train", "--dataset", "digits"]
    assert "btl_tcp_if_include" not in argv


def test_one_nic_setting_reaches_open_mpi_nccl_and_gloo():
    argv = make_plan(network_interface="ens5").mpirun_argv()
    joined = " ".join(argv)
    for expected in ("--mca btl_tcp_if_include ens5", "--mca oob_tcp_if_include ens5", "-x NCCL_SOCKET_IFNAME=ens5",
                     "-x GLOO_SOCKET_IFNAME=ens5", "-x HOROVOD_GLOO_IFACE=ens5"):
        assert expected in joined


def test_containers_are_named_and_labelled_per_cluster_and_node():
    plan = make_plan()
    first, second = plan.nodes
    assert plan.container_name(second) == "horovod-stack-c0ffee00-gpu-b"
    assert plan.labels(first) == {"horovod-stack.cluster": "c0ffee00", "horovod-stack.node": "gpu-a",
                                  "horovod-stack.role": "rank0"}
    assert plan.labels(second)["horovod-stack.role"] == "worker"


def test_worker_environment_holds_no_secret():
    environment = make_plan().worker_environment(Node("node_1", "ssh://node_1"))
    assert environment == {"SSH_PORT": "12345", "WORKER_ADDRESS": "node_1"}


def test_known_hosts_pins_each_node_on_the_ssh_port():
    plan = make_plan(ssh_port=2222)
    lines = plan.known_hosts({"gpu-a": "ssh-ed25519 AAA1", "gpu-b": "ssh-ed25519 AAA2"})
    assert lines == "[gpu-a]:2222 ssh-ed25519 AAA1\n[gpu-b]:2222 ssh-ed25519 AAA2\n"
    assert "StrictHostKeyChecking yes" in plan.ssh_config() and "Port 2222" in plan.ssh_config()


@pytest.mark.parametrize("overrides, message", [
    ({"nodes": ()}, "pass --nodes"),
    ({"nodes": ("node_1", "node_1")}, "listed twice"),
    ({"nodes": ("bad name",)}, "not a host name"),
    ({"slots": 0}, "--slots"),
    ({"ssh_port": 70000}, "--ssh-port"),
    ({"engines": {"node_9": "tcp://x:2375"}}, "not in --nodes"),
])
def test_bad_settings_are_refused(overrides, message):
    with pytest.raises(SettingsError, match=message):
        LaunchSettings(**{"nodes": ("node_1",), **overrides})


def test_env_file_values_and_flag_overrides():
    env = {"NODES": "node_1,node_2", "SSH_PORT": "2222", "SLOTS_PER_WORKER": "2", "IMAGE": "img:1",
           "DOCKER_HOST_NODE_2": "unix:///run/node2.sock"}
    settings = resolve_settings(env, nodes=None, slots=4)
    assert settings.nodes == ("node_1", "node_2")
    assert (settings.ssh_port, settings.slots, settings.image) == (2222, 4, "img:1")
    assert settings.engine_url("node_1") == "ssh://node_1"
    assert settings.engine_url("node_2") == "unix:///run/node2.sock"
    assert engine_override_key("gpu-box.lan") == "DOCKER_HOST_GPU_BOX_LAN"


def test_bad_env_value_names_the_key():
    with pytest.raises(SettingsError, match="SSH_PORT='twelve' in the .env file"):
        resolve_settings({"SSH_PORT": "twelve"}, nodes="node_1")


def test_env_example_is_a_valid_settings_file():
    settings = resolve_settings(load_env_file(Path(__file__).parents[1] / ".env.example"), nodes=None)
    assert settings.nodes == ("node_1", "node_2") and settings.ssh_port == 12345
