"""Every name check takes the whole name (a trailing newline is no name), and names reach a shell only as arguments."""

import subprocess

import pytest

from launcher.core.imageref import parse_image
from launcher.core.options import SettingsError, env_problem, job_command
from launcher.host.engines.docker_driver import host_view_argv, parse_host_view
from launcher.host.planning.plan import mpi_host
from launcher.k8s import mpijob_request
from tests.conftest import launch_settings


def node_names(name: str) -> None:
    launch_settings(nodes=(name,))


def env_keys(key: str) -> None:
    problem = env_problem(f"{key}=1")
    if problem:
        raise ValueError(problem)


def open_mpi_host_names(name: str) -> None:
    mpi_host(name, None)  # a name Open MPI refuses needs an address, and none is given


def image_tags(tag: str) -> None:
    parse_image(f"horovod-stack:{tag}")


def image_paths(path: str) -> None:
    parse_image(f"team/{path}:1")


def registry_hosts(host: str) -> None:
    parse_image(f"{host}/horovod-stack:1")


def digests(digest: str) -> None:
    parse_image(f"horovod-stack@{digest}")


def mpijob(**where) -> None:
    mpijob_request.request(
        {"command": job_command(())},
        **{"name": "digits", "workers": 2, "image": "registry.example/horovod-stack:1", **where},
    )


def mpijob_names(name: str) -> None:
    mpijob(name=name)


def mpijob_namespaces(namespace: str) -> None:
    mpijob(namespace=namespace)


def mpijob_claims(claim: str) -> None:
    mpijob(shared_claim=claim)


def mpijob_images(image: str) -> None:
    mpijob(image=image)


def mpijob_queues(queue: str) -> None:
    mpijob(scheduler="volcano", queue=queue)


def mpijob_priority_classes(priority_class: str) -> None:
    mpijob(priority_class=priority_class)


def mpijob_quantities(quantity: str) -> None:
    mpijob(memory=quantity)


SHA = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "check, good",
    [
        (node_names, "node_1"),
        (env_keys, "NCCL_DEBUG"),
        (open_mpi_host_names, "gpu-a"),
        (image_tags, "latest"),
        (image_paths, "horovod-stack"),
        (registry_hosts, "registry.example:5000"),
        (digests, SHA),
        (mpijob_names, "digits"),
        (mpijob_namespaces, "team-a"),
        (mpijob_claims, "horovod-stack-shared"),
        (mpijob_images, "registry.example/horovod-stack:1"),
        (mpijob_queues, "gpu-team"),
        (mpijob_priority_classes, "team-high"),
        (mpijob_quantities, "16Gi"),
    ],
    ids=lambda value: getattr(value, "__name__", None),
)
@pytest.mark.parametrize("suffix", ["", "\n"], ids=["as given", "with a trailing newline"])
def test_a_name_passes_and_the_same_name_with_a_trailing_newline_does_not(check, good, suffix):
    if not suffix:
        check(good)
        return
    with pytest.raises((ValueError, SettingsError)):
        check(good + suffix)


@pytest.mark.parametrize(
    "name, message",
    [
        ("node_1\n", "node name 'node_1\\n' is not a host name: pass --nodes with names like node_1"),
        ("node_1\nnode_2", "node name 'node_1\\nnode_2' is not a host name"),
    ],
)
def test_a_refused_node_name_is_one_line_showing_the_newline(name, message):
    with pytest.raises(SettingsError) as refused:
        node_names(name)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


HOSTILE_NAMES = (
    "x'; touch MARKER; echo '",
    '"; touch MARKER; echo "',
    "$(touch MARKER)",
    "`touch MARKER`",
    'x" ; system("touch MARKER") ; "',
)


def test_node_names_reach_the_host_view_shell_only_as_arguments():
    argv = host_view_argv(12345, ("node_1", *HOSTILE_NAMES))
    assert argv[:2] == ["bash", "-c"] and argv[3:] == ["bash", "node_1", *HOSTILE_NAMES]
    assert "node_1" not in argv[2] and "MARKER" not in argv[2]


def test_the_host_view_script_resolves_names_and_runs_none_of_them(tmp_path):
    names = (
        "localhost",
        "no-such-host.invalid",
        *(name.replace("MARKER", str(tmp_path / "ran")) for name in HOSTILE_NAMES),
    )
    # The same script the node's container runs, here with this machine's bash, getent and awk.
    done = subprocess.run(host_view_argv(1, names), capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] in ("free", "taken")
    assert [line for line in lines if line.startswith("resolved")] == ["resolved localhost 127.0.0.1"]
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    "output, taken, nics, resolved",
    [
        ("free\nnic lo\nnic eth0\naddress eth0 10.0.0.5/24\nresolved node_2 10.0.0.6\n", False, ("lo", "eth0"),
         (("node_2", "10.0.0.6"),)),
        ("taken\nnic eth0\n", True, ("eth0",), ()),
        ("", None, None, None),  # the container's output came back empty: asked again, then one line naming the node
        ("\n", None, None, None),
    ],
)  # fmt: skip
def test_the_host_view_is_read_from_its_containers_lines_and_nothing_is_no_view(output, taken, nics, resolved):
    view = parse_host_view(output)
    if taken is None:
        assert view is None
        return
    assert view is not None and (view.port_taken, view.nics, view.resolved) == (taken, nics, resolved)
