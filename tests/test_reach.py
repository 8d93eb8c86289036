"""Reaching a node's engine in bounded time: what each ssh or TCP failure says (pure), and the probe against real
ssh and a real TCP port on this machine."""

from __future__ import annotations

import errno
import socket
import time

import pytest

from launcher.host.engines import reach
from launcher.host.engines.reach import SshTarget, ssh_failure, tcp_failure

NODE = SshTarget("gpu_2", "alice", 2222)


@pytest.mark.parametrize(
    "stderr, words",
    [
        ("ssh: Could not resolve hostname gpu_2: Name or service not known", "gpu_2 does not resolve on this machine"),
        ("ssh: connect to host gpu_2 port 2222: Connection timed out", "no answer from gpu_2 within 10 s"),
        ("ssh: connect to host gpu_2 port 2222: No route to host", "no route to gpu_2"),
        ("ssh: connect to host gpu_2 port 2222: Network is unreachable", "no route to gpu_2"),
        ("ssh: connect to host gpu_2 port 2222: Connection refused", "gpu_2 refuses ssh (no sshd on its port)"),
        ("Host key verification failed.", "run `ssh alice@gpu_2 -p 2222` once"),
        ("alice@gpu_2: Permission denied (publickey).", "`ssh-copy-id alice@gpu_2 -p 2222` installs it"),
        (
            "permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock",
            "`sudo usermod -aG docker alice`",
        ),
        ("bash: line 1: docker: command not found", "docker is not installed on gpu_2"),
        (
            "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?",
            "Docker is not running on gpu_2",
        ),
        (
            "kex_exchange_identification: read: Connection reset by peer\n",
            "(kex_exchange_identification: read: Connection reset by peer); run it by hand",
        ),
    ],
)
def test_each_ssh_failure_is_one_line_with_its_fix(stderr, words):
    line = ssh_failure(NODE, stderr, 10)
    assert words in line and "\n" not in line


@pytest.mark.parametrize(
    "error, words",
    [
        (socket.gaierror(-2, "Name or service not known"), "gpu_2 does not resolve on this machine"),
        (TimeoutError("timed out"), "no answer from gpu_2:2375 within 3 s"),
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "nothing listens on gpu_2:2375"),
        (OSError(errno.EHOSTUNREACH, "No route to host"), "no route to gpu_2"),
    ],
)
def test_each_tcp_failure_is_one_line(error, words):
    assert words in tcp_failure("gpu_2", 2375, error, 3)


def test_ssh_options_bound_the_connection_and_never_prompt():
    assert NODE.options(2.4) == ["-o", "ConnectTimeout=2", "-o", "BatchMode=yes", "-l", "alice", "-p", "2222"]
    assert SshTarget.of("ssh://alice@gpu_2:2222") == NODE
    assert SshTarget.of("ssh://node_1") == SshTarget("node_1")


def test_a_port_nobody_listens_on_is_refused_at_once_and_a_listening_one_answers():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert reach.probe(f"tcp://127.0.0.1:{port}", 3) is None
    assert f"nothing listens on 127.0.0.1:{port}" in (reach.probe(f"tcp://127.0.0.1:{port}", 3) or "")


def test_a_name_ssh_cannot_resolve_is_named_within_the_timeout():
    started = time.monotonic()
    problem = reach.probe("ssh://no-such-node.invalid", 3)
    assert problem and problem.startswith("no-such-node.invalid does not resolve on this machine"), problem
    assert time.monotonic() - started < 30
