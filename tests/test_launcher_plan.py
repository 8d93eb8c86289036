"""The launch plan and settings: pure, table-driven."""

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from app.entrypoint import TRAINER
from app.horovod_defaults import HOROVOD_DEFAULTS
from launcher.agent import compose
from launcher.core.jobspec import (
    JobSpec,
    RunPaths,
    Worker,
    command_probe,
    horovodrun_argv,
    hostfile,
    mpirun_argv,
    pin_known_host,
    run_paths,
    ssh_config,
    with_run_dir,
)
from launcher.core.nics import nic_problem, nic_selection, virtual_subnets
from launcher.core.options import JobOptions, SettingsError, job_command
from launcher.core.protocol import (
    GPU_WORKER_ULIMITS,
    KEEPALIVE_COUNT,
    KEEPALIVE_INTERVAL_SECONDS,
    SILENCE_SECONDS,
    WORKER_ULIMITS,
)
from launcher.host.planning import workdir
from launcher.host.planning.plan import ClusterPlan, Found, GpuRequest, Node, mpi_host, run_dir, worker_host_names
from launcher.host.planning.settings import engine_override_key, load_env_file, parse_gpus, resolve_settings
from tests.conftest import launch_settings
from tests.conftest import plan_of as make_plan
from tests.standins import PartialEngine, container


@pytest.mark.parametrize(
    "settings, expected",
    [
        ({}, "gpu-a slots=1\ngpu-b slots=1\n"),
        ({"slots": 3}, "gpu-a slots=3\ngpu-b slots=3\n"),
        ({"gpus_per_node": 4}, "gpu-a slots=4\ngpu-b slots=4\n"),  # one rank per GPU
        ({"gpus_per_node": 4, "slots": 4}, "gpu-a slots=4\ngpu-b slots=4\n"),  # slots given beside GPUs: the same count
        ({"nodes": ("a.lan",)}, "a.lan slots=1\n"),
    ],
)
def test_hostfile(settings, expected):
    spec = make_plan(**settings).job_spec()
    assert hostfile(spec.workers, spec.slots) == expected


@pytest.mark.parametrize(
    "name, address, expected",
    [
        ("gpu-a", None, "gpu-a"),
        ("gpu-a.lan", "10.0.0.1", "gpu-a.lan"),
        ("node_1", "10.0.0.1", "10.0.0.1"),  # Open MPI refuses underscores in host names
    ],
)
def test_mpi_host(name, address, expected):
    assert mpi_host(name, address) == expected


def test_underscored_nodes_go_to_mpirun_by_address():
    plan = make_plan(nodes=("node_1", "node_2"))
    with pytest.raises(ValueError, match="node_1 needs an address"):
        plan.mpi_host(plan.rank0)
    plan = make_plan(
        nodes=("node_1", "node_2"), found=Found(addresses=(("node_1", "10.0.0.1"), ("node_2", "10.0.0.2")))
    )
    spec = plan.job_spec()
    assert spec.workers == (Worker("node_1", "10.0.0.1", 1), Worker("node_2", "10.0.0.2", 1))
    assert hostfile(spec.workers, spec.slots) == "10.0.0.1 slots=1\n10.0.0.2 slots=1\n"


@pytest.mark.parametrize(
    "after_dashes, command",
    [
        ([], ["python", "-m", "app.train"]),
        (["--dataset", "digits"], ["python", "-m", "app.train", "--dataset", "digits"]),
        (["--", "--epochs", "2"], ["python", "-m", "app.train", "--epochs", "2"]),
        (["python", "train.py", "--epochs", "5"], ["python", "train.py", "--epochs", "5"]),
        (["--", "python", "train.py", "--", "x"], ["python", "train.py", "--", "x"]),  # only the first -- is ours
        (["./run.sh"], ["./run.sh"]),
    ],
)
def test_job_command_is_the_users_command_or_the_trainer(after_dashes, command):
    assert job_command(after_dashes) == tuple(command)


def test_mpirun_argv_carries_the_seed_flags_and_trainer_args():
    argv = make_plan(slots=2, command=tuple(job_command(["--dataset", "digits"]))).job_argv()
    assert argv[:5] == ["mpirun", "-np", "4", "--hostfile", "/home/mpiuser/hostfile"]
    assert argv[5:9] == ["-bind-to", "none", "-map-by", "slot"]
    assert argv[9] == "--tag-output"  # [1,RANK]<stdout>: before every line a rank writes
    assert ["-x", "NCCL_DEBUG=WARN"] == argv[argv.index("NCCL_DEBUG=WARN") - 1 : argv.index("NCCL_DEBUG=WARN") + 1]
    assert argv[-7:] == ["python", "-m", "app.train", "--dataset", "digits", "--run-dir", "/shared/runs/c0ffee00"]
    assert "btl_tcp_if_include" not in argv


def test_users_command_env_and_workdir_reach_mpirun():
    argv = make_plan(
        command=("python", "train.py", "--epochs", "5"),
        env=("NCCL_DEBUG=INFO", "SEED=3"),
        workdir=Path(__file__).parent,
    ).job_argv()
    assert argv[-4:] == ["python", "train.py", "--epochs", "5"]
    assert argv[-6:-4] == ["-wdir", "/workdir"]
    joined = " ".join(argv)
    assert "-x NCCL_DEBUG=INFO" in joined and "-x SEED=3" in joined and "NCCL_DEBUG=WARN" not in joined
    assert "app.train" not in joined


@pytest.mark.parametrize(
    "env, expected",
    [
        ((), [f"{name}={value}" for name, value in HOROVOD_DEFAULTS.items()]),
        (("SEED=3",), ["SEED=3", *(f"{name}={value}" for name, value in HOROVOD_DEFAULTS.items())]),
        (
            ("OMPI_MCA_mpi_yield_when_idle=0",),
            [
                "OMPI_MCA_mpi_yield_when_idle=0",
                *(
                    f"{name}={value}"
                    for name, value in HOROVOD_DEFAULTS.items()
                    if name != "OMPI_MCA_mpi_yield_when_idle"
                ),
            ],
        ),
        (
            ("OMPI_MCA_mpi_yield_when_idle_x=1",),
            ["OMPI_MCA_mpi_yield_when_idle_x=1", "OMPI_MCA_mpi_yield_when_idle=1", "NCCL_DEBUG=WARN"],
        ),
        (tuple(f"{name}=9" for name in HOROVOD_DEFAULTS), [f"{name}=9" for name in HOROVOD_DEFAULTS]),
    ],
)
def test_horovod_defaults_reach_every_rank_unless_the_user_sets_them(env, expected):
    argv = mpirun_argv(ranks=2, hostfile="/h", command=["python", "t.py"], env=env)
    passed = [argv[i + 1] for i, word in enumerate(argv) if word == "-x" and "=" in argv[i + 1]]
    assert passed == expected


def compose_spec(args=(), **environ) -> JobSpec:
    return compose.job_spec({"NETWORK_INTERFACE": "eth0", **environ}, list(args))


def test_compose_builds_the_same_command_line_as_the_launcher():
    """Both launch methods' jobs are JobSpecs, and one JobSpec.job_argv builds the line: the same flags, one place."""
    plan = make_plan(network_interface="eth0", command=("python", "train.py"))
    assert compose_spec(TRAIN_COMMAND="python train.py").job_argv() == plan.job_argv()
    trainer = compose_spec(["--dataset=digits"], TRAIN_ARGS="--epochs 3", RUN_ID="r1")
    assert trainer.job_argv()[-6:] == ["app.train", "--dataset=digits", "--epochs", "3", "--run-dir", "/shared/runs/r1"]
    assert trainer.run_dir == "/shared/runs/r1" and trainer.worker_service == "worker" and trainer.make_key
    quoted = compose_spec(TRAIN_COMMAND="python t.py --name 'a b'", WORKDIR="/home/me/code")
    assert quoted.job_argv()[-6:] == ["-wdir", "/workdir", "python", "t.py", "--name", "a b"]
    assert quoted.run_dir is None  # the user's command decides where it writes


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, {"expected_workers": 2, "slots": 1, "ssh_port": 12345, "ready_timeout": 180, "elastic_timeout": 60}),
        (
            {"WORKERS": "3", "SLOTS_PER_WORKER": "2", "SSH_PORT": "2222", "READY_TIMEOUT": "30"},
            {"expected_workers": 3, "slots": 2, "ssh_port": 2222, "ready_timeout": 30},
        ),
        ({"READY_TIMEOUT": "", "ELASTIC_TIMEOUT": ""}, {"ready_timeout": 180, "elastic_timeout": 60}),  # .env.example
        (
            {"WORKERS": "3", "ELASTIC_MIN_WORKERS": "2", "ELASTIC_TIMEOUT": "15"},
            {"elastic_min_workers": 2, "elastic_timeout": 15},
        ),
    ],
)
def test_compose_settings_and_their_defaults(environ, expected):
    spec = compose_spec(**environ)
    assert {key: getattr(spec, key, None) or getattr(spec.options, key) for key in expected} == expected


@pytest.mark.parametrize(
    "environ, message",
    [
        (
            {"ELASTIC_MIN_WORKERS": "3"},
            "ELASTIC_MIN_WORKERS=3 is not from 1 to the 2 workers in WORKERS; fix it in .env",
        ),
        ({"ELASTIC_MIN_WORKERS": "two"}, "ELASTIC_MIN_WORKERS=two is not a whole number; fix it in .env"),
        ({"WORKERS": "0"}, "WORKERS=0 is not a whole number of at least 1; fix it in .env"),
        ({"SSH_PORT": "70000"}, "SSH_PORT=70000 is not a TCP port (1-65535); fix it in .env"),
        ({"READY_TIMEOUT": "soon"}, "READY_TIMEOUT=soon is not a whole number; fix it in .env"),
        ({"STALL_ACTION": "panic"}, "STALL_ACTION='panic' is not one of warn, fail; fix it in .env"),
    ],
)
def test_bad_compose_settings_are_refused_in_one_line(environ, message):
    with pytest.raises(SettingsError) as error:
        compose_spec(**environ)
    assert str(error.value).startswith(message)


@pytest.mark.parametrize(
    "options, folder, restartable, expected",
    [
        (["--run-dir", "/r"], None, False, RunPaths(True, "/r", "/r/metrics.jsonl")),
        (["--run-dir=/r", "--epochs", "2"], "/c1", True, RunPaths(True, "/r", "/r/metrics.jsonl", "/r/checkpoints")),
        (["--epochs", "2"], None, True, RunPaths(True)),
        (["--epochs", "2"], "/c1", False, RunPaths(True, "/c1", "/c1/metrics.jsonl")),
        (["--metrics-file", "/m", "--checkpoint-dir", "/ck"], "/c1", True, RunPaths(True, "/c1", "/m", "/ck")),
        (["--checkpoint-dir=/ck"], None, True, RunPaths(True, None, None, "/ck")),
        ("python train.py --run-dir /r", "/c1", True, RunPaths(checkpoint_dir="/c1/checkpoints")),
        ("python train.py --run-dir /r", "/c1", False, RunPaths()),  # a user's command: its own paths
    ],
)  # fmt: skip
def test_a_jobs_run_paths_are_laid_out_once_from_its_options_and_run_folder(options, folder, restartable, expected):
    command = tuple(options.split()) if isinstance(options, str) else (*TRAINER, *options)
    assert run_paths(command, folder, restartable) == expected
    spec = JobSpec("j", JobOptions(command=command, max_restarts=1 if restartable else 0), 1, run_folder=folder)
    assert spec.paths == expected and JobSpec.from_json(spec.to_json()).paths == expected


@pytest.mark.parametrize(
    "command, files, expected",
    [
        (["python", "train.py"], ["train.py"], ""),
        (["python", "train.py"], [], "script train.py is not there"),
        (["python", "-m", "app.train"], [], ""),
        (["no-such-program-here", "x"], [], "no-such-program-here is not on PATH"),
        (["bash", "missing.sh"], [], ""),  # only python's script is checked; bash reports its own
    ],
)
def test_command_probe(tmp_path, command, files, expected):
    for name in files:
        (tmp_path / name).write_text("")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # `python`: this one, venv or not
    env = {**os.environ, "PATH": path}
    result = subprocess.run(command_probe(command), cwd=tmp_path, capture_output=True, text=True, env=env)
    assert (result.returncode == 0) == (expected == "")
    assert result.stdout.strip() == expected


def test_workdir_archive_is_owned_by_mpiuser_and_skips_caches(tmp_path):
    import io
    import tarfile

    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"0")
    (tmp_path / "pkg" / "model.py").write_text("x = 1\n")
    (tmp_path / "train.py").write_text("print(1)\n")
    with tarfile.open(fileobj=io.BytesIO(workdir.archive(tmp_path))) as tar:
        members = {member.name: member for member in tar.getmembers()}
    assert set(members) == {"pkg", "pkg/model.py", "train.py"}
    assert {member.uid for member in members.values()} == {1000}


def test_one_nic_setting_reaches_open_mpi_nccl_and_gloo():
    argv = make_plan(network_interface="ens5").job_argv()
    joined = " ".join(argv)
    for expected in (
        "--mca btl_tcp_if_include ens5",
        "--mca oob_tcp_if_include ens5",
        "-x NCCL_SOCKET_IFNAME==ens5",
        "-x GLOO_SOCKET_IFNAME=ens5",
        "-x HOROVOD_GLOO_IFACE=ens5",
    ):
        assert expected in joined


def test_containers_are_named_and_labelled_per_cluster_and_node():
    plan = make_plan()
    first, second = plan.nodes
    assert plan.container_name(second) == "horovod-stack-c0ffee00-gpu-b"
    assert plan.labels(first) == {
        "horovod-stack.cluster": "c0ffee00",
        "horovod-stack.node": "gpu-a",
        "horovod-stack.role": "rank0",
        "horovod-stack.ranks": "1",
        "horovod-stack.image": "horovod-stack:latest",
        "horovod-stack.framework": "PyTorch",
        "horovod-stack.metrics": "/shared/runs/c0ffee00/metrics.jsonl",  # the bundled trainer's, for `status`
    }
    assert plan.labels(second)["horovod-stack.role"] == "worker"


def test_worker_environment_holds_no_secret():
    environment = make_plan().worker_environment(Node("node_1", "ssh://node_1"))
    assert environment == {"SSH_PORT": "12345", "WORKER_ADDRESS": "node_1"}


def test_rank0_container_stops_with_the_jobs_status():
    plan = make_plan()
    assert plan.worker_environment(plan.rank0)["EXIT_WITH_JOB"] == "1"
    assert "EXIT_WITH_JOB" not in plan.worker_environment(plan.nodes[1])


def test_ranks_given_gpus_are_told_so():
    assert "HOROVOD_STACK_GPUS=1" in make_plan(gpus_per_node=2).job_spec().rank_env
    assert "HOROVOD_STACK_GPUS=1" not in " ".join(make_plan().job_argv())
    assert "-x HOROVOD_STACK_GPUS=1" in " ".join(make_plan(gpus_per_node=2).job_argv())
    assert compose_spec(HOROVOD_STACK_GPUS="1", NCCL_DEBUG="INFO").options.env == (
        "HOROVOD_STACK_GPUS=1",
        "TF_FORCE_GPU_ALLOW_GROWTH=true",
        "NCCL_DEBUG=INFO",
    )


def gpu_settings(argv: list[str]) -> list[str]:
    """The GPU variables a job's command line gives its ranks (mpirun's -x, horovodrun's `env` words)."""
    return [word for word in argv if word.startswith(("HOROVOD_STACK_GPUS=", "TF_FORCE_GPU_ALLOW_GROWTH="))]


@pytest.mark.parametrize(
    "fields, given",
    [
        ({}, []),  # a CPU job: nothing
        ({"gpus_per_node": 2}, ["HOROVOD_STACK_GPUS=1", "TF_FORCE_GPU_ALLOW_GROWTH=true"]),
        (
            {"gpus_per_node": 2, "env": ("TF_FORCE_GPU_ALLOW_GROWTH=false",)},  # the user's --env wins, given once
            ["TF_FORCE_GPU_ALLOW_GROWTH=false", "HOROVOD_STACK_GPUS=1"],
        ),
        (
            {"gpus_per_node": 2, "elastic": True, "network_interface": "eth0"},  # horovodrun's environment too
            ["HOROVOD_STACK_GPUS=1", "TF_FORCE_GPU_ALLOW_GROWTH=true"],
        ),
    ],
)
def test_a_gpu_jobs_ranks_get_tensorflows_memory_growth_unless_the_user_sets_it(fields, given):
    """On every image (torch ignores it): an unpinned TensorFlow rank would otherwise take nearly all of every GPU."""
    argv = make_plan(**fields).job_argv()
    assert gpu_settings(argv) == given
    assert not any(word.startswith("CUDA_VISIBLE_DEVICES") for word in argv)  # Horovod's pin line needs every GPU


@pytest.mark.parametrize(
    "environ, given",
    [
        ({}, ()),
        ({"HOROVOD_STACK_GPUS": "1"}, ("HOROVOD_STACK_GPUS=1", "TF_FORCE_GPU_ALLOW_GROWTH=true")),  # compose.gpu.yaml
        ({"HOROVOD_STACK_GPUS": ""}, ()),
    ],
)
def test_composes_gpu_file_gives_its_ranks_the_same_gpu_settings(environ, given):
    assert compose.rank_env(environ) == given


def test_the_launchers_job_spec_names_every_node_rank0_first_and_survives_json():
    plan = make_plan(nodes=("gpu-a", "gpu-b", "gpu-c"), env=("SEED=3",), ready_timeout=42, keep_running=True)
    spec = plan.job_spec()
    assert [worker.name for worker in spec.workers] == ["gpu-a", "gpu-b", "gpu-c"] and spec.expected_workers == 3
    assert spec.keep_running and spec.options.ready_timeout == 42 and spec.options.env == ("SEED=3",)
    assert spec.driver == "rank 0's container on gpu-a" and not spec.make_key
    assert spec.run_dir == "/shared/runs/c0ffee00"  # the bundled trainer's folder, which the agent makes
    assert JobSpec.from_json(spec.to_json()) == spec
    assert spec.job_argv() == plan.job_argv()


@pytest.mark.parametrize(
    "known, expected",
    [
        ("", "[w1]:2222 ssh-ed25519 NEW\n"),
        ("[w2]:2222 ssh-ed25519 K2\n", "[w2]:2222 ssh-ed25519 K2\n[w1]:2222 ssh-ed25519 NEW\n"),
        (
            "[w1]:2222 ssh-ed25519 OLD\n[w2]:2222 ssh-ed25519 K2\n",
            "[w2]:2222 ssh-ed25519 K2\n[w1]:2222 ssh-ed25519 NEW\n",
        ),
        ("[w1]:22 ssh-ed25519 OTHERPORT\n", "[w1]:22 ssh-ed25519 OTHERPORT\n[w1]:2222 ssh-ed25519 NEW\n"),
    ],
)
def test_pinning_a_host_key_replaces_only_that_workers_old_key(known, expected):
    assert pin_known_host(known, "w1", 2222, "ssh-ed25519 NEW mpiuser@host\n") == expected


def test_ssh_client_config_is_strict_on_the_stacks_port():
    config = ssh_config(2222)
    assert "StrictHostKeyChecking yes" in config and "Port 2222" in config and "BatchMode yes" in config
    assert "IdentityFile /cluster/private/id_ed25519" in config and "ConnectTimeout 10" in config


def test_every_ssh_into_the_cluster_and_every_workers_sshd_give_up_on_a_silent_peer_alike():
    """A session to a node that went silent (no TCP reset) would otherwise wait forever, and the job with it."""
    client = ssh_config(2222).splitlines()
    assert "  ServerAliveInterval 5" in client and "  ServerAliveCountMax 3" in client
    sshd = (Path(__file__).parent.parent / "docker" / "sshd_config").read_text().splitlines()
    assert (
        f"ClientAliveInterval {KEEPALIVE_INTERVAL_SECONDS}" in sshd and f"ClientAliveCountMax {KEEPALIVE_COUNT}" in sshd
    )
    assert KEEPALIVE_INTERVAL_SECONDS * KEEPALIVE_COUNT == SILENCE_SECONDS == 15


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"nodes": ()}, "pass --nodes"),
        ({"nodes": ("node_1", "node_1")}, "listed twice"),
        ({"nodes": ("bad name",)}, "not a host name"),
        ({"slots": 0}, "--slots"),
        ({"ssh_port": 70000}, "--ssh-port"),
        ({"engines": {"node_9": "tcp://x:2375"}}, "not in --nodes"),
        ({"env": ("NO_EQUALS",)}, "is not KEY=VALUE"),
        ({"env": ("1BAD=x",)}, "is not KEY=VALUE"),
        ({"workdir": Path("/no/such/folder")}, "--workdir /no/such/folder is not a folder here"),
        ({"devices": ("infiniband",)}, r"--device 'infiniband' is not HOST_PATH\[:CONTAINER_PATH\] under /dev"),
        ({"devices": ("/dev/infiniband:/etc",)}, r"is not HOST_PATH\[:CONTAINER_PATH\] under /dev"),
    ],
)
def test_bad_settings_are_refused(overrides, message):
    with pytest.raises(SettingsError, match=message):
        launch_settings(**{"nodes": ("node_1",), **overrides})


def test_env_file_values_and_flag_overrides():
    env = {
        "NODES": "node_1,node_2",
        "SSH_PORT": "2222",
        "SLOTS_PER_WORKER": "2",
        "IMAGE": "img:1",
        "DOCKER_HOST_NODE_2": "unix:///run/node2.sock",
    }
    settings = resolve_settings(env, nodes=None, slots=4)
    assert settings.nodes == ("node_1", "node_2")
    assert (settings.job.ssh_port, settings.slots, settings.image) == (2222, 4, "img:1")
    assert settings.engine_url("node_1") == "ssh://node_1"
    assert settings.engine_url("node_2") == "unix:///run/node2.sock"
    assert engine_override_key("gpu-box.lan") == "DOCKER_HOST_GPU_BOX_LAN"


def test_launcher_reads_its_own_nic_key_not_composes():
    compose_only = {"NODES": "node_1", "NETWORK_INTERFACE": "eth0", "WORKERS": "4"}
    assert resolve_settings(compose_only, nodes=None).job.network_interface is None
    both = {**compose_only, "NODE_NETWORK_INTERFACE": "ens5"}
    assert resolve_settings(both, nodes=None).job.network_interface == "ens5"
    assert resolve_settings(both, nodes=None, job={"network_interface": "ib0"}).job.network_interface == "ib0"


@pytest.mark.parametrize(
    "wanted, nics, expected",
    [
        (None, ("lo", "ens5"), None),
        ("ens5", ("lo", "ens5"), None),
        (
            "eth0",
            ("lo", "ens5", "docker0"),
            "no network interface eth0 there (it has docker0, ens5, lo); pass "
            "--network-interface with one of them, or set NODE_NETWORK_INTERFACE in .env",
        ),
        (
            "ens",
            ("lo", "ens5"),
            "no network interface ens there (it has ens5, lo); pass --network-interface with one of "
            "them, or set NODE_NETWORK_INTERFACE in .env",
        ),  # no prefix match: Gloo needs the name
        (
            "eth0",
            (),
            "no network interface eth0 there (it has none); pass --network-interface with one of them, or set "
            "NODE_NETWORK_INTERFACE in .env",
        ),
    ],
)
def test_nic_problem(wanted, nics, expected):
    assert nic_problem(wanted, nics) == expected


def test_each_cluster_runs_in_its_own_folder():
    assert run_dir("3f9a1c2e") == "/shared/runs/3f9a1c2e"


def test_bad_env_value_names_the_key():
    with pytest.raises(SettingsError, match="SSH_PORT='twelve' in the .env file"):
        resolve_settings({"SSH_PORT": "twelve"}, nodes="node_1")


def test_env_example_is_a_valid_settings_file():
    settings = resolve_settings(load_env_file(Path(__file__).parents[1] / ".env.example"), nodes=None)
    assert settings.nodes == ("node_1", "node_2") and settings.job.ssh_port == 12345
    assert settings.job.network_interface is None  # compose's eth0 is not the nodes' NIC


def test_workdir_too_big_to_copy_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("launcher.host.planning.settings.WORKDIR_LIMIT_BYTES", 1000)
    (tmp_path / "data.bin").write_bytes(b"0" * 5000)
    with pytest.raises(SettingsError, match="more than the 0 MB copied to every node: put data in SHARED_DIR"):
        launch_settings(nodes=("node_1",), workdir=tmp_path)


@pytest.mark.parametrize(
    "command, expected",
    [
        (["python", "-m", "app.train"], ["python", "-m", "app.train", "--run-dir", "/r"]),
        (["python", "-m", "app.train", "--run-dir", "/mine"], ["python", "-m", "app.train", "--run-dir", "/mine"]),
        (["python", "-m", "app.train", "--run-dir=/mine"], ["python", "-m", "app.train", "--run-dir=/mine"]),
        (["python", "train.py"], ["python", "train.py"]),  # the user's script decides where it writes
    ],
)
def test_the_bundled_trainer_gets_a_run_folder_of_its_own(command, expected):
    assert with_run_dir(command, "/r") == expected


def elastic_plan(**overrides) -> ClusterPlan:
    settings = {"nodes": ("gpu-a", "gpu-b", "gpu-c"), "network_interface": "ens5", "elastic_min_workers": 2}
    return make_plan(**{**settings, **overrides})


def test_elastic_job_runs_horovodrun_with_discovery_over_the_nodes_rank0_first():
    argv = elastic_plan(slots=2, env=("SEED=3",)).job_argv()
    assert argv[0] == "env" and "SEED=3" in argv  # the discovery finds the nodes in the job spec, not here
    assert "HOROVOD_GLOO_TIMEOUT_SECONDS=10" in argv and "GLOO_SOCKET_IFNAME=ens5" in argv
    # A worker that joins or comes back gets longer to reach the rendezvous than a collective gets (Python and torch
    # starting on a busy node); without it the running ranks aborted at its arrival.
    assert "HOROVOD_STACK_RENDEZVOUS_TIMEOUT_SECONDS=120" in argv
    run = argv[argv.index("horovodrun") :]
    flags = " ".join(run[: run.index("python")])
    for expected in (
        "--gloo",
        "-np 6",
        "--min-np 4",
        "--max-np 6",
        "--slots-per-host 2",
        "--host-discovery-script /opt/horovod-stack/docker/discover-hosts.sh",
        "--network-interface ens5",
        "--ssh-port 12345",
        "--elastic-timeout 60",
        "--blacklist-cooldown-range 2 30",
    ):
        assert expected in flags
    assert run[run.index("python") :] == [
        "python",
        "-m",
        "app.train",
        "--run-dir",
        "/shared/runs/c0ffee00",
        "--elastic",
    ]


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"elastic_max_workers": 2}, ["-np", "2", "--min-np", "2", "--max-np", "2"]),
        ({"elastic_min_workers": 1, "elastic_timeout": 15}, ["-np", "3", "--min-np", "1", "--max-np", "3"]),
    ],
)
def test_elastic_sizes(overrides, expected):
    argv = elastic_plan(**overrides).job_argv()
    start = argv.index("-np")
    assert argv[start : start + 6] == expected
    assert argv[argv.index("--elastic-timeout") + 1] == str(overrides.get("elastic_timeout", 60))


def test_elastic_users_script_keeps_its_own_words_and_timeout_override():
    argv = horovodrun_argv(
        min_ranks=1,
        max_ranks=2,
        slots_per_host=1,
        network_interface="eth0",
        ssh_port=22,
        elastic_timeout=30,
        command=["python", "train.py"],
        workdir="/workdir",
        env=("HOROVOD_GLOO_TIMEOUT_SECONDS=45",),
    )
    assert argv[:3] == ["env", "-C", "/workdir"] and argv[-2:] == ["python", "train.py"]
    assert [item for item in argv if item.startswith("HOROVOD_GLOO_TIMEOUT")] == ["HOROVOD_GLOO_TIMEOUT_SECONDS=45"]
    with pytest.raises(SettingsError, match="pass --network-interface"):  # the one rule: no NIC, no elastic line
        JobOptions(elastic=True, network_interface=None)


def test_compose_builds_the_elastic_command_line_from_the_same_plan():
    argv = compose_spec(["--epochs=2"], WORKERS="3", ELASTIC_MIN_WORKERS="2", RUN_ID="x").job_argv()
    assert argv[argv.index("--min-np") + 1] == "2" and argv[argv.index("--max-np") + 1] == "3"
    assert argv[argv.index("python") :] == [
        "python",
        "-m",
        "app.train",
        "--epochs=2",
        "--run-dir",
        "/shared/runs/x",
        "--elastic",
    ]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"elastic_min_workers": 0}, "--min-nodes 0 is not 1 or more"),
        ({"elastic_min_workers": 4}, "--min-nodes 4 is not from 1 to the 3 node(s) in --nodes"),
        ({"elastic_max_workers": 1}, "--max-nodes 1 is not from --min-nodes (2) up"),
        ({"elastic_max_workers": 4}, "--max-nodes 4 is not from --min-nodes (2) to the 3 node(s) in --nodes"),
        ({"elastic_timeout": 0}, "--elastic-timeout 0 is not positive seconds"),
        ({"network_interface": None}, "elastic training needs the NIC the workers reach each other on"),
        ({"elastic_min_workers": None, "elastic": False, "restart_workers": True}, "add --elastic"),
        ({"elastic_min_workers": None, "elastic": False, "elastic_max_workers": 2}, "--max-nodes is for elastic jobs"),
    ],
)
def test_bad_elastic_settings_are_refused(overrides, message):
    settings = {"nodes": ("a", "b", "c"), "network_interface": "ens5", "elastic_min_workers": 2, **overrides}
    with pytest.raises(SettingsError) as error:
        launch_settings(**settings)
    assert message in str(error.value)


def test_compose_gives_its_containers_the_launchers_limits():
    from launcher.core.protocol import WORKER_CAPABILITIES

    repo = Path(__file__).resolve().parents[1]
    compose, gpu_file = (repo / "compose.yaml").read_text(), (repo / "compose.gpu.yaml").read_text()
    for name, limit in WORKER_ULIMITS.items():
        assert f"    {name}: {limit}\n" in compose
    for name in GPU_WORKER_ULIMITS.keys() - WORKER_ULIMITS.keys():
        assert f"      {name}: {GPU_WORKER_ULIMITS[name]}\n" in gpu_file and f"{name}:" not in compose
    from launcher.core.protocol import PTRACE_CAPABILITY, SHM_SIZE, WORKER_USER

    assert f"cap_add: [{', '.join((*WORKER_CAPABILITIES, PTRACE_CAPABILITY))}]" in compose
    assert f"  shm_size: ${{SHM_SIZE:-{SHM_SIZE}}}\n" in compose  # DataLoader workers' batches, NCCL's buffers
    assert "cap_drop: [ALL]" in compose and f'user: "{WORKER_USER}"' in compose


def test_compose_mounts_an_empty_folder_at_workdir_while_workdir_is_unset():
    """Not the checkout: its .env would be readable by every rank."""
    import yaml

    repo = Path(__file__).resolve().parents[1]
    services = yaml.safe_load((repo / "compose.yaml").read_text())["services"]
    for service in ("worker", "launcher"):
        mounts = [volume for volume in services[service]["volumes"] if ":/workdir" in volume]
        assert mounts == ["${WORKDIR:-./docker/no-workdir}:/workdir:ro"], service
    assert [path.name for path in (repo / "docker" / "no-workdir").iterdir()] == ["README.md"]


def test_devices_come_from_the_flag_or_the_env_file():
    from_env = resolve_settings({"NODES": "a", "DEVICES": "/dev/infiniband, /dev/null:/dev/x"}, nodes=None)
    assert from_env.devices == ("/dev/infiniband", "/dev/null:/dev/x")
    flag = resolve_settings({"NODES": "a", "DEVICES": "/dev/infiniband"}, nodes=None, devices=("/dev/null",))
    assert flag.devices == ("/dev/null",)


@pytest.mark.parametrize(
    "overrides, gpu, ulimits, devices",
    [
        ({}, None, WORKER_ULIMITS, ()),
        ({"gpus_per_node": 2}, GpuRequest(count=2), GPU_WORKER_ULIMITS, ()),
        ({"gpus_per_node": 2, "gpu_ids": ("2", "3")}, GpuRequest(device_ids=("2", "3")), GPU_WORKER_ULIMITS, ()),
        (
            {"devices": ("/dev/infiniband", "/dev/null:/dev/x")},
            None,
            WORKER_ULIMITS,
            ("/dev/infiniband:/dev/infiniband", "/dev/null:/dev/x"),
        ),
    ],
)
def test_worker_container_requests(overrides, gpu, ulimits, devices):
    plan = make_plan(**overrides)
    container = plan.worker_container(plan.nodes[1])
    assert (container.gpu, container.ulimits, container.devices) == (gpu, ulimits, devices)
    assert container.capabilities == ("IPC_LOCK", "SYS_PTRACE") and not container.no_new_privileges
    assert container.user == "1000" and container.shm_size == "1g"  # Docker's default 64 MB is too little
    assert GPU_WORKER_ULIMITS == {"stack": 64 * 1024**2, "memlock": -1}
    assert container.volumes == {"horovod-stack-shared": "/shared"}
    assert container.environment == plan.worker_environment(plan.nodes[1])


@pytest.mark.parametrize(
    "overrides, restarts",
    [
        ({}, [0, 0, 0]),
        ({"elastic": True, "network_interface": "ens5"}, [0, 0, 0]),
        # The engines restart the workers, not the launcher: attached or detached alike. Rank 0's container holds the
        # elastic driver; it is never started again.
        ({"elastic": True, "network_interface": "ens5", "restart_workers": True}, [0, 5, 5]),
        ({"elastic": True, "network_interface": "ens5", "restart_workers": True, "detach": True}, [0, 5, 5]),
        ({"elastic": True, "network_interface": "ens5", "restart_workers": True, "worker_restarts": 2}, [0, 2, 2]),
    ],
)
def test_a_failed_worker_is_started_again_by_its_nodes_engine_with_restart_workers(overrides, restarts):
    plan = make_plan(nodes=("a", "b", "c"), **overrides)
    containers = [plan.worker_container(node) for node in plan.nodes]
    assert [container.restarts for container in containers] == restarts
    assert [container.environment.get("RESTART_ON_FAILURE") for container in containers] == [
        "1" if count else None for count in restarts
    ]
    assert ("a failed worker started again" in plan.describe()) is (max(restarts) > 0)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2", (2, ())),
        ("0", (0, ())),
        ("0,1", (2, ("0", "1"))),
        (" 3, 1 ", (2, ("3", "1"))),
        ("device=1", (1, ("1",))),
        ("GPU-8f6b3c1e-aaaa-bbbb", (1, ("GPU-8f6b3c1e-aaaa-bbbb",))),
        ("0,0", SettingsError),
        ("two", SettingsError),
        ("", SettingsError),
        ("1,", SettingsError),
    ],
)
def test_gpus_are_a_count_or_ids(text, expected):
    if expected is SettingsError:
        with pytest.raises(SettingsError, match="is neither a GPU count nor distinct GPU IDs: pass a count"):
            parse_gpus(text)
        return
    assert parse_gpus(text) == expected


def test_gpus_come_from_the_flag_or_the_env_file():
    from_env = resolve_settings({"NODES": "a", "GPUS_PER_NODE": "0,1"}, nodes=None)
    assert (from_env.gpus_per_node, from_env.gpu_ids, ClusterPlan.of(from_env).slots_per_node) == (2, ("0", "1"), 2)
    assert resolve_settings({"NODES": "a", "GPUS_PER_NODE": "0,1"}, nodes=None, gpus="4").gpu_ids == ()
    assert resolve_settings({"NODES": "a", "GPUS_PER_NODE": ""}, nodes=None).gpus_per_node == 0
    with pytest.raises(SettingsError, match="^GPUS_PER_NODE in .env 'x' is neither"):
        resolve_settings({"NODES": "a", "GPUS_PER_NODE": "x"}, nodes=None)


@pytest.mark.parametrize(
    "nic, subnets, across_hosts, expected",
    [
        (
            "ens5",
            ("172.17.0.0/16",),
            True,
            "--mca btl_tcp_if_include ens5 --mca oob_tcp_if_include ens5 "
            "-x NCCL_SOCKET_IFNAME==ens5 -x GLOO_SOCKET_IFNAME=ens5 -x HOROVOD_GLOO_IFACE=ens5",
        ),
        (None, (), False, ""),
        (None, (), True, "-x NCCL_SOCKET_IFNAME=^lo,docker,br-,veth,virbr"),
        (
            None,
            ("172.17.0.0/16", "172.26.0.0/16"),
            True,
            "--mca btl_tcp_if_exclude 127.0.0.1/8,172.17.0.0/16,172.26.0.0/16 --mca oob_tcp_if_exclude "
            "127.0.0.1/8,172.17.0.0/16,172.26.0.0/16 -x NCCL_SOCKET_IFNAME=^lo,docker,br-,veth,virbr",
        ),
    ],
)
def test_nic_selection(nic, subnets, across_hosts, expected):
    assert " ".join(nic_selection(nic, subnets, across_hosts)) == expected


@pytest.mark.parametrize(
    "addresses, expected",
    [
        ((("lo", "127.0.0.1/8"), ("eth0", "10.0.0.1/24")), []),
        (
            (
                ("docker0", "172.17.0.1/16"),
                ("br-5e", "172.26.0.1/16"),
                ("virbr0", "192.168.122.1/24"),
                ("docker0", "172.17.0.1/16"),
                ("ens5", "10.1.2.3/16"),
            ),
            ["172.17.0.0/16", "172.26.0.0/16", "192.168.122.0/24"],
        ),
    ],
)
def test_virtual_subnets(addresses, expected):
    assert virtual_subnets(addresses) == expected


def test_unpinned_nics_are_left_out_of_a_multi_host_job_and_survive_json():
    plan = make_plan(found=Found(excluded_subnets=("172.17.0.0/16",)))
    spec = JobSpec.from_json(plan.job_spec().to_json())
    assert (spec.excluded_subnets, spec.across_hosts) == (("172.17.0.0/16",), True)
    assert "--mca btl_tcp_if_exclude 127.0.0.1/8,172.17.0.0/16" in " ".join(spec.job_argv())
    pinned = make_plan(network_interface="ens5", found=Found(excluded_subnets=("172.17.0.0/16",)))
    assert pinned.job_spec().excluded_subnets == ()
    assert "NCCL_SOCKET_IFNAME=^" not in " ".join(make_plan(nodes=("gpu-a",)).job_argv())
    users_own = " ".join(make_plan(env=("NCCL_SOCKET_IFNAME=ib0",)).job_argv())
    assert "NCCL_SOCKET_IFNAME=^" not in users_own and "-x NCCL_SOCKET_IFNAME=ib0" in users_own


@pytest.mark.parametrize(
    "text, expected",
    [
        ("node_1,node_2", [("node_1", None), ("node_2", None)]),
        ("node_1:4, node_2:2", [("node_1", 4), ("node_2", 2)]),
        ("gpu-a:1,gpu-b", [("gpu-a", 1), ("gpu-b", None)]),
        ("node_1:0", "'node_1:0' has no whole rank count of at least 1 after the colon"),
        ("node_1:x", "'node_1:x' has no whole rank count"),
        ("node_1:", "'node_1:' has no whole rank count"),
    ],
)
def test_nodes_are_hosts_with_optional_rank_counts(text, expected):
    from launcher.host.planning.settings import parse_node_list

    if isinstance(expected, str):
        with pytest.raises(SettingsError, match=expected):
            parse_node_list(text)
        return
    assert parse_node_list(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("node_1 slots=4\nnode_2 slots=2\n", [("node_1", 4), ("node_2", 2)]),
        ("# rank 0 first\n\nnode_1 slots=2 max_slots=2  # the big box\nnode_2\n", [("node_1", 2), ("node_2", None)]),
        ("node_1 slots=4\nnode_2 slots = 2\n", "line 2: 'node_2 slots = 2' is not `HOST` or `HOST slots=N`"),
        ("node_1 slots=0\n", "line 1: 'node_1 slots=0' is not"),
        ("node_1 cpus=4\n", "line 1"),
        ("# nothing\n", "lists no host"),
    ],
)
def test_hostfiles_in_open_mpis_format(text, expected):
    from launcher.host.planning.settings import parse_hostfile

    if isinstance(expected, str):
        with pytest.raises(SettingsError, match=expected):
            parse_hostfile(text, "--hostfile hosts")
        return
    assert parse_hostfile(text, "--hostfile hosts") == expected


def test_per_node_counts_reach_the_hostfile_the_gpus_and_the_plan_line(tmp_path):
    settings = resolve_settings({}, nodes="gpu-a:4,gpu-b", gpus="2")
    plan = ClusterPlan.of(settings, cluster_id="c0ffee00")
    spec = plan.job_spec()
    assert hostfile(spec.workers, spec.slots) == "gpu-a slots=4\ngpu-b slots=2\n"
    assert [plan.gpu_request(node) for node in plan.nodes] == [GpuRequest(count=4), GpuRequest(count=2)]
    assert plan.total_ranks == 6 and "mpirun -np 6 " in " ".join(spec.job_argv())
    assert "6 ranks on 2 node(s) [gpu-a: 4 rank(s) on 4 GPU(s) (ssh://gpu-a), gpu-b: 2 rank(s) on 2 GPU(s)" in (
        plan.describe()
    )
    hosts = tmp_path / "hosts"
    hosts.write_text("# rank 0 first\ngpu-a slots=4\n\ngpu-b slots=2  # the small box\n")
    from_file = ClusterPlan.of(
        resolve_settings({"NODES": "x"}, nodes=None, hostfile=hosts, gpus="2"), cluster_id="c0ffee00"
    )
    assert [plan.slots(node) for node in from_file.nodes] == [4, 2]
    # The same plan, run for real with --nodes on the test hosts (test_per_node_rank_counts_put_two_ranks_on_node_1...)
    assert from_file.describe() == plan.describe() and from_file.job_spec() == spec


@pytest.mark.parametrize(
    "env, flags, message",
    [
        ({}, {"nodes": "a:2,a"}, "node a is listed twice: list each host once, with its rank count"),
        ({}, {"nodes": "a,b", "hostfile": Path("/nonexistent/hosts")}, "--hostfile and --nodes both list the nodes"),
        ({}, {"nodes": None, "hostfile": Path("/nonexistent/hosts")}, "--hostfile /nonexistent/hosts does not exist"),
        ({"NODES": "a:0"}, {"nodes": None}, "NODES in .env: 'a:0' has no whole rank count"),
        ({}, {"nodes": "a:4,b", "gpus": "0,1"}, "--gpus names 2 GPU\\(s\\) for every node, but a node's count differs"),
        (
            {},
            {"nodes": "a,b", "job": {"network_interface": "10.0.0/24"}},
            "--network-interface '10.0.0/24' is neither a NIC name nor an IPv4 subnet in CIDR form",
        ),
    ],
)
def test_bad_node_lists_and_subnets_are_refused(env, flags, message):
    with pytest.raises(SettingsError, match=message):
        resolve_settings(env, **flags)


def test_a_subnet_is_normalised_and_gives_open_mpi_the_subnet_and_each_rank_its_own_nic():
    settings = resolve_settings({}, nodes="a,b", job={"network_interface": "10.0.0.7/24"})
    assert settings.job.network_interface == "10.0.0.0/24"
    plan = ClusterPlan.of(settings, "c0ffee00", Found(node_nics=(("a", "ens5"), ("b", "eno1"))))
    argv = " ".join(plan.job_argv())
    assert "--mca btl_tcp_if_include 10.0.0.0/24 --mca oob_tcp_if_include 10.0.0.0/24" in argv
    assert "NCCL_SOCKET_IFNAME" not in argv  # each rank's own, from launcher.agent.rank_nic
    assert argv.endswith(
        "python -m launcher.agent.rank_nic 10.0.0.0/24 -- python -m app.train --run-dir /shared/runs/c0ffee00"
    )


def test_an_elastic_job_over_a_subnet_serves_on_rank0s_nic_and_ranks_find_their_own():
    settings = resolve_settings(
        {},
        nodes="a:2,b:1,c:3",
        job={
            "network_interface": "10.0.0.0/24",
            "elastic": True,
            "elastic_min_workers": 2,
            "env": ("NCCL_SOCKET_IFNAME=ib0",),
        },
    )
    plan = ClusterPlan.of(settings, "c0ffee00", Found(node_nics=(("a", "ens5"), ("b", "eno1"))))
    argv = " ".join(plan.job_argv())
    # The two smallest hosts (1 + 2 ranks) still hold the minimum; all three (6) are the most.
    assert "-np 6 --min-np 3 --max-np 6 " in argv
    assert "GLOO_SOCKET_IFNAME=ens5 HOROVOD_GLOO_IFACE=ens5" in argv and "--network-interface ens5 " in argv
    assert "python -m launcher.agent.rank_nic 10.0.0.0/24 --keep NCCL_SOCKET_IFNAME -- python -m app.train" in argv


@pytest.mark.parametrize(
    "addresses, subnet, nic, problem",
    [
        ((("lo", "127.0.0.1/8"), ("ens5", "10.0.0.2/24")), "10.0.0.0/24", "ens5", None),
        ((("eno1", "10.0.0.9/16"),), "10.0.0.0/24", "eno1", None),
        (
            (("lo", "127.0.0.1/8"), ("eth0", "192.0.2.2/24"), ("docker0", "172.17.0.1/16")),
            "10.0.0.0/24",
            None,
            "no address in 10.0.0.0/24 there (it has eth0 192.0.2.2/24, docker0 172.17.0.1/16); pass "
            "--network-interface "
            "with a subnet every node has an address in",
        ),
    ],
)
def test_the_nic_in_a_subnet(addresses, subnet, nic, problem):
    from launcher.core.nics import own_nic, subnet_problem

    assert own_nic(subnet, addresses) == nic
    found = subnet_problem(subnet, addresses)
    assert (found is None) if problem is None else (found is not None and found.startswith(problem))


HOST_ADDRESSES = (
    ("lo", "127.0.0.1/8"),
    ("docker0", "172.17.0.1/16"),
    ("ens5", "10.0.0.2/24"),
    ("ens6", "10.1.0.2/16"),
    ("ens6", "192.0.2.7/24"),
)


@pytest.mark.parametrize(
    "network_interface, addresses, nic",
    [
        (None, HOST_ADDRESSES, None),  # none pinned: Open MPI and NCCL leave the virtual NICs out
        ("", HOST_ADDRESSES, None),
        ("ens5", HOST_ADDRESSES, "ens5"),  # a name: that NIC, as named
        ("eth9", HOST_ADDRESSES, "eth9"),  # even one the host lacks: nic_problem refuses it, not this
        ("10.0.0.0/24", HOST_ADDRESSES, "ens5"),  # a subnet: the NIC holding an address in it
        ("192.0.2.0/24", HOST_ADDRESSES, "ens6"),  # a NIC's second address counts
        ("10.1.0.0/24", HOST_ADDRESSES, "ens6"),  # a /16 address whose IP is in the /24: its IP decides
        ("10.9.0.0/16", HOST_ADDRESSES, None),  # no address in it
        ("10.0.0.0/8", HOST_ADDRESSES, "ens5"),  # two NICs in it: the first, in the host's order
        ("10.0.0.0/24", (), None),
    ],
)
def test_which_nic_is_mine_here(network_interface, addresses, nic):
    from launcher.core.nics import own_nic

    assert own_nic(network_interface, addresses) == nic


def test_the_dry_run_report_shows_each_container_the_hostfile_and_the_command_but_no_key():
    plan = ClusterPlan.of(resolve_settings({}, nodes="gpu-a:2,gpu-b", gpus="1"), cluster_id="c0ffee00")
    report = plan.dry_run_report("sha256:7405069ce4ce0000")
    for expected in (
        "plan: 3 ranks on 2 node(s)",
        "gpu-a (rank 0, runs the job agent; engine ssh://gpu-a)",
        "container horovod-stack-c0ffee00-gpu-a (host name gpu-a): image horovod-stack:latest (7405069ce4ce), "
        "network host",
        "ranks 2; GPUs 2 GPU(s); ulimits stack=67108864, memlock=-1; user 1000; capabilities "
        "IPC_LOCK,SYS_PTRACE (all others dropped); devices none",
        "mounts horovod-stack-shared -> /shared",
        "environment SSH_PORT, WORKER_ADDRESS, EXIT_WITH_JOB",
        "hostfile /home/mpiuser/hostfile:\n  gpu-a slots=2\n  gpu-b slots=1\n",
        "mpirun: mpirun -np 3 ",
    ):
        assert expected in report, report
    assert "PRIVATE KEY" not in report and "id_ed25519" not in report


@pytest.mark.parametrize(
    "argv, addresses, environ",
    [
        (
            ["10.0.0.0/24", "--", "python", "t.py"],
            [("lo", "127.0.0.1/8"), ("eno1", "10.0.0.2/24")],
            {"NCCL_SOCKET_IFNAME": "=eno1", "GLOO_SOCKET_IFNAME": "eno1", "HOROVOD_GLOO_IFACE": "eno1"},
        ),
        (
            ["10.0.0.0/24", "--keep", "NCCL_SOCKET_IFNAME", "--", "python", "t.py"],
            [("ens5", "10.0.0.1/24")],
            {"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "ens5", "HOROVOD_GLOO_IFACE": "ens5"},
        ),
    ],
)
def test_each_rank_takes_its_own_hosts_nic_in_the_subnet(argv, addresses, environ, monkeypatch):
    from launcher.agent import rank_nic

    ran = []
    monkeypatch.setattr(rank_nic, "host_addresses", lambda: addresses)
    monkeypatch.setattr(rank_nic.os, "execvp", lambda program, args: ran.append(args))
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    for name in ("GLOO_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE"):  # what horovodrun set: rank 0's NIC
        monkeypatch.setenv(name, "eth0")
    rank_nic.main(argv)
    assert ran == [["python", "t.py"]]
    assert {name: os.environ[name] for name in environ} == environ


def test_a_rank_whose_host_has_no_address_in_the_subnet_says_so(monkeypatch, capsys):
    from launcher.agent import rank_nic

    monkeypatch.setattr(rank_nic, "host_addresses", lambda: [("eth0", "192.0.2.2/24")])
    assert rank_nic.main(["10.0.0.0/24", "--", "python", "t.py"]) == 1
    assert "no address in 10.0.0.0/24 (it has eth0 192.0.2.2/24)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, expected",
    [
        ("/data/mnist:/data:ro", "Bind(source='/data/mnist', target='/data', read_only=True)"),
        ("/srv/sets/:/sets", "Bind(source='/srv/sets', target='/sets', read_only=False)"),
        ("/data:/shared/data", "Bind(source='/data', target='/shared/data', read_only=False)"),  # inside: fine
        ("data:/data", "is not HOST_PATH:CONTAINER_PATH[:ro], both absolute"),
        ("/data", "is not HOST_PATH:CONTAINER_PATH"),
        ("/data:/data:rx", "is not HOST_PATH:CONTAINER_PATH"),
        ("/data:/shared", "would hide the stack's own /shared"),
        ("/data:/home", "would hide the stack's own /home/mpiuser"),
        ("/data/./sets/:/data//sets/../sets:ro", "Bind(source='/data/sets', target='/data/sets', read_only=True)"),
        ("/data:/workdir/data", "Bind(source='/data', target='/workdir/data', read_only=False)"),
        ("/data:/opt/data", "Bind(source='/data', target='/opt/data', read_only=False)"),
        ("/data:/usrdata", "Bind(source='/data', target='/usrdata', read_only=False)"),  # not under /usr
        (
            "/data:/cluster/ssh",
            "'/data:/cluster/ssh' is inside the stack's own /cluster: mount it elsewhere, e.g. /data",
        ),
        (
            "/data:/data/../cluster/ssh",
            "'/data:/data/../cluster/ssh' (target /cluster/ssh) is inside the stack's own "
            "/cluster: mount it elsewhere, e.g. /data",
        ),
        ("/data:/home/mpiuser/.ssh", "is inside the stack's own /home/mpiuser"),
        ("/data://home/mpiuser/", "(target /home/mpiuser) would hide the stack's own /home/mpiuser"),
        ("/data:/opt/horovod-stack/app", "is inside the stack's own /opt/horovod-stack"),
        ("/data:/opt/venv/bin", "is inside the stack's own /opt/venv"),
        ("/data:/opt", "would hide the stack's own /opt/horovod-stack"),
        ("/data:/workdir", "would hide the stack's own /workdir"),
        ("/data:/etc", "is in the system's /etc"),
        ("/data:/etc/ssh/", "is in the system's /etc"),
        ("/data:/usr/local/lib/python3", "is in the system's /usr"),
        ("/data:/bin", "is in the system's /bin"),
        ("/data:/proc", "is in the system's /proc"),
        ("/data:/sys/fs", "is in the system's /sys"),
        ("/data:/dev/shm", "is in the system's /dev"),
        ("/data:/", "'/data:/' would hide the whole container: mount it elsewhere"),
        ("/data:/data/../..", "(target /) would hide the whole container"),
        ("/data:data", "both absolute"),
        ("/data:./data", "both absolute"),
        ("/data:../cluster", "both absolute"),
    ],
)
def test_mounts(text, expected):
    from launcher.core.mounts import parse_bind

    if expected.startswith("Bind("):
        assert repr(parse_bind(text)) == expected
        return
    with pytest.raises(ValueError, match=re.escape(expected)) as refused:
        parse_bind(text)
    assert "\n" not in str(refused.value)


def test_mounts_come_from_the_flag_or_the_env_file_and_reach_every_worker():
    settings = resolve_settings({"NODES": "a,b", "MOUNTS": "/data/mnist:/data:ro, /ckpt:/ckpt"}, nodes=None)
    plan = ClusterPlan.of(settings, cluster_id="c0ffee00")
    assert [str(bind) for bind in plan.worker_container(plan.nodes[1]).binds] == [
        "/data/mnist -> /data (read-only)",
        "/ckpt -> /ckpt",
    ]
    flag = resolve_settings({"NODES": "a", "MOUNTS": "/x:/x"}, nodes=None, job={"mounts": ("/y:/y",)})
    assert flag.job.binds[0].source == "/y"
    with pytest.raises(SettingsError, match="--mount 'x:/x' is not"):
        resolve_settings({"NODES": "a", "MOUNTS": "x:/x"}, nodes=None)


@pytest.mark.parametrize(
    "env, flags, expected",
    [
        ({}, {}, 0),
        ({"TIME_LIMIT": "600"}, {}, 600),
        ({"TIME_LIMIT": "600"}, {"time_limit": 30}, 30),  # the flag wins
        ({"TIME_LIMIT": "600"}, {"time_limit": 0}, 0),  # 0 given is 0, not "not given"
        ({}, {"time_limit": -1}, "--time-limit -1 is neither 0 (no limit) nor positive seconds; pass --time-limit"),
        (
            {"TIME_LIMIT": "soon"},
            {},
            "TIME_LIMIT='soon' in the .env file is not a whole number: fix it or pass --time-limit",
        ),
    ],
)
def test_the_time_limit_comes_from_the_flag_or_the_env_file(env, flags, expected):
    if isinstance(expected, str):
        with pytest.raises(SettingsError, match=re.escape(expected)):
            resolve_settings({"NODES": "a", **env}, job=flags)
        return
    assert resolve_settings({"NODES": "a", **env}, job=flags).job.time_limit == expected
    assert compose_spec(**{key: value for key, value in env.items()}).options.time_limit == (600 if env else 0)


def test_a_flag_wins_over_its_env_key_without_reading_it():
    settings = resolve_settings({"NODES": "a", "STALL_TIMEOUT": "abc"}, job={"stall_timeout": 30})
    assert settings.job.stall_timeout == 30  # the .env value is not the job's, so it is not refused
    with pytest.raises(SettingsError, match=re.escape("READY_TIMEOUT='soon' in the .env file is not a number: fix it")):
        resolve_settings({"NODES": "a", "READY_TIMEOUT": "soon"})  # no flag sets it: nothing else to pass


def test_each_launch_methods_words_survive_the_job_specs_json():
    spec = compose_spec(WORKERS="3", ELASTIC_MIN_WORKERS="2")
    again = JobSpec.from_json(spec.to_json())
    assert again == spec and again.options.launch_method == "compose"
    assert again.options.option_names.of("elastic_min_workers", 2) == "ELASTIC_MIN_WORKERS=2"
    assert make_plan().job_spec().options.option_names.of("elastic_min_workers", 2) == "--min-nodes 2"


def test_an_elastic_subnet_job_before_rank_0s_nic_is_known_says_where_it_goes():
    """A dry run of nodes that lack the image has no facts yet; the line is still made, never raised."""
    argv = " ".join(make_plan(nodes=("a", "b"), network_interface="10.0.0.0/24", elastic_min_workers=1).job_argv())
    assert "--network-interface <rank 0's NIC in 10.0.0.0/24> " in argv


@pytest.mark.parametrize(
    "nodes, host_names",
    [
        (["node_1", "node_2"], ["node-1", "node-2"]),
        (["gpu1.lab-a", "gpu1.lab-b"], ["gpu1-lab-a", "gpu1-lab-b"]),  # Open MPI would cut both to gpu1
        (["GPU_A", "gpu-a", "gpu.a"], ["gpu-a", "gpu-a-2", "gpu-a-3"]),  # one spelling each, made unique
        (["10.0.0.5", "_x_"], ["10-0-0-5", "x"]),
        (["a" * 70, "a" * 64], ["a" * 63, "a" * 61 + "-2"]),  # at most 63 characters
    ],
)
def test_each_worker_gets_a_host_name_of_its_own(nodes, host_names):
    assert list(worker_host_names(nodes).values()) == host_names


def test_connect_timeout_comes_from_env_and_reaches_every_node():
    plan = ClusterPlan.of(resolve_settings({"CONNECT_TIMEOUT": "2.5"}, nodes="a,b"))
    assert [node.connect_timeout for node in plan.nodes] == [2.5, 2.5]
    assert ClusterPlan.of(resolve_settings({}, nodes="a")).rank0.connect_timeout == 10
    with pytest.raises(SettingsError, match=re.escape("CONNECT_TIMEOUT='soon' in the .env file is not a number")):
        resolve_settings({"CONNECT_TIMEOUT": "soon"}, nodes="a")
    with pytest.raises(SettingsError, match="CONNECT_TIMEOUT in .env must be a positive number of seconds"):
        resolve_settings({"CONNECT_TIMEOUT": "0"}, nodes="a")


# --- secret settings -------------------------------------------------------------------------------------------------
def test_a_secrets_value_comes_from_this_machines_environment_before_the_env_file_and_is_never_shown():
    env = {"NODES": "node_1,node_2", "SECRETS": "API_KEY,HF_TOKEN", "HF_TOKEN": "hf-from-env-file"}
    settings = resolve_settings(env, environ={"API_KEY": "sk-SECRET123"})
    assert settings.job.secrets == ("API_KEY", "HF_TOKEN")
    assert settings.secret_values == {"API_KEY": "sk-SECRET123", "HF_TOKEN": "hf-from-env-file"}
    plan = ClusterPlan.of(settings, cluster_id="c0ffee00")
    shown = repr(settings) + plan.describe() + plan.dry_run_report(None) + plan.job_spec().to_json()
    assert "sk-SECRET123" not in shown and "hf-from-env-file" not in shown
    assert "secrets API_KEY=***, HF_TOKEN=***" in plan.dry_run_report(None)
    argv = plan.job_spec().job_argv()
    assert argv[argv.index("API_KEY") - 1] == "-x" and argv[argv.index("HF_TOKEN") - 1] == "-x"


@pytest.mark.parametrize(
    "flags, environ, message",
    [
        (
            {"secrets": ("API_KEY",)},
            {},
            "--secret API_KEY: API_KEY is set neither in this machine's environment nor in "
            ".env: export API_KEY=... or add it to .env",
        ),
        ({"secrets": ("2BAD",)}, {"2BAD": "x"}, "--secret '2BAD' is not a variable name"),
        (
            {"secrets": ("API_KEY",), "env": ("API_KEY=plain",)},
            {"API_KEY": "x"},
            "API_KEY is both a secret (--secret) and in --env: drop it from --env",
        ),
    ],
)
def test_bad_secret_settings_are_refused_in_one_line(flags, environ, message):
    with pytest.raises(SettingsError) as refused:
        resolve_settings({}, nodes="node_1,node_2", job=flags, environ=environ)
    assert message in str(refused.value)


def test_rank_0_gets_the_secrets_as_a_0600_file_beside_the_cluster_key_and_no_worker_gets_them():
    import io
    import json
    import tarfile

    from launcher.core.sshtrust import KeyPair
    from launcher.host.running import handover

    class Recorder(PartialEngine):
        def __init__(self, name: str) -> None:
            self.node, self.put = Node(name, f"ssh://{name}"), cast(list, [])

        def put_files(self, container_id, folder, archive):
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                for member in tar.getmembers():
                    extracted = tar.extractfile(member)
                    assert extracted is not None, member.name  # the handover sends files only
                    self.put.append((f"{folder}/{member.name}", member.mode, extracted.read()))

        def read_file(self, container_id, path):
            return "ssh-ed25519 HOSTKEY"

    settings = resolve_settings(
        {"NODES": "node-1,node-2"}, job={"secrets": ("API_KEY",)}, environ={"API_KEY": "sk-SECRET123"}
    )
    plan = ClusterPlan.of(settings, cluster_id="c0ffee00")
    engines = [Recorder("node-1"), Recorder("node-2")]
    containers = [container("w1", "c0ffee00"), container("w2", "c0ffee00", role="worker")]
    handover.hand_over_trust(plan, engines, containers, KeyPair(b"PRIVATE", "ssh-ed25519 PUBLIC"), 0, lambda _: None)
    secrets = [(mode, content) for path, mode, content in engines[0].put if path == "/cluster/private/secrets.json"]
    assert secrets == [(0o600, json.dumps({"API_KEY": "sk-SECRET123"}).encode())]
    assert not any(b"sk-SECRET123" in content for _, _, content in engines[1].put)
    job = next(content for path, _, content in engines[0].put if path.endswith("job.json"))
    assert b"sk-SECRET123" not in job and b'"API_KEY"' in job


@pytest.mark.parametrize(
    "env, flags, ptrace",
    [
        ({}, {}, True),
        ({"PTRACE": "0"}, {}, False),
        ({"PTRACE": "off"}, {}, False),
        ({"PTRACE": "yes"}, {}, True),
        ({"PTRACE": "1"}, {"ptrace": False}, False),
    ],
)
def test_ptrace_comes_from_the_flag_or_the_env_file(env, flags, ptrace):
    assert resolve_settings(env, nodes="a,b", job=flags).job.ptrace is ptrace


def test_a_bad_ptrace_value_is_refused_naming_the_key_and_the_flag():
    with pytest.raises(SettingsError) as refused:
        resolve_settings({"PTRACE": "maybe"}, nodes="a,b")
    assert (
        str(refused.value)
        == "PTRACE='maybe' in the .env file is not 1 or 0 (true or false): fix it or pass --no-ptrace"
    )


def test_no_ptrace_workers_drop_it_and_gain_no_privileges():
    plan = ClusterPlan.of(resolve_settings({}, nodes="a,b", job={"ptrace": False}), cluster_id="c0ffee00")
    container = plan.worker_container(plan.nodes[1])
    assert container.capabilities == ("IPC_LOCK",) and container.no_new_privileges
    assert "capabilities IPC_LOCK (all others dropped; no new privileges)" in plan.dry_run_report(None)


@pytest.mark.parametrize(
    "addresses, nic, reached_at, listen",
    [
        # a NIC by name: its addresses, and the one rank 0 reaches the node at
        (
            [("lo", "127.0.0.1/8"), ("eno1", "10.0.0.2/24"), ("eno2", "192.168.1.2/24")],
            "eno1",
            "192.168.1.2",
            ("10.0.0.2", "192.168.1.2"),
        ),
        # a subnet: the address in it, once even where the node is reached at it
        ([("eno1", "10.0.0.2/24"), ("docker0", "172.17.0.1/16")], "10.0.0.0/24", "10.0.0.2", ("10.0.0.2",)),
        # an address the node does not hold (NAT, another view of the name) is no place to listen
        ([("eno1", "10.0.0.2/24")], "eno1", "203.0.113.9", ("10.0.0.2",)),
        # the NIC is not there: nothing (the NIC check refuses such a node before any start)
        ([("eno1", "10.0.0.2/24")], "ib0", None, ()),
    ],
)
def test_where_a_workers_sshd_listens_with_a_nic_pinned(addresses, nic, reached_at, listen):
    from launcher.core.nics import listen_addresses

    assert listen_addresses(addresses, nic, reached_at) == listen


def test_a_pinned_nic_tells_each_worker_where_to_listen():
    from launcher.host.planning.plan import Found

    settings = resolve_settings({}, nodes="a,b", job={"network_interface": "eno1"})
    plan = ClusterPlan.of(
        settings,
        cluster_id="c0ffee00",
        found=Found(listen_addresses=(("a", ("10.0.0.1",)), ("b", ("10.0.0.2", "192.168.1.2")))),
    )
    assert plan.worker_environment(plan.nodes[0])["SSH_LISTEN"] == "10.0.0.1"
    assert plan.worker_environment(plan.nodes[1])["SSH_LISTEN"] == "10.0.0.2,192.168.1.2"
    unpinned = ClusterPlan.of(resolve_settings({}, nodes="a,b"), cluster_id="c0ffee00")
    assert "SSH_LISTEN" not in unpinned.worker_environment(unpinned.nodes[1])
