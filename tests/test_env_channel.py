"""The record that carries an elastic job's environment to its remote ranks over the ssh channel's stdin
(docker/horovod-runner/env_channel.py): what goes in comes out, whatever its size up to the bound, nothing past the
bound is sent or read, and the worker's session keeps its own variables. The channel patched into horovodrun, with
real processes: tests/test_horovod_patch.py; on the test hosts: tests/test_rendezvous_on_test_hosts.py."""

from __future__ import annotations

import importlib.util
import os
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def load_channel():
    found = importlib.util.spec_from_file_location("env_channel", REPO / "docker" / "horovod-runner" / "env_channel.py")
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


channel = load_channel()


def through_a_file(tmp_path: Path, data: bytes, then: bytes = b"") -> tuple[dict[str, str], bytes]:
    """decode() of `data` followed by `then`, as the receiver reads them from its stdin; what it left unread."""
    path = tmp_path / "stdin"
    path.write_bytes(data + then)
    fd = os.open(path, os.O_RDONLY)
    try:
        return channel.decode(fd), os.read(fd, len(then) + 1)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "variables",
    [
        {},
        {"API_KEY": "sk-SECRET"},
        {"EMPTY": ""},
        {"UNICODE": "é 中文 🚀", "NAMÉ": "x"},
        {"LINES": "one\ntwo\r\nthree", "QUOTES": 'it\'s "quoted" \\ `$(rm -rf /)` ${HOME}'},
        {"NOT_UTF8": b"\xff\xfe bytes".decode("utf-8", "surrogateescape")},  # how Python holds a non-UTF-8 value
        {f"HST_{i}": f"value {i}" for i in range(5000)},  # far past sshd's 128 a session
        {"BIG": "x" * (channel.RECORD_LIMIT - len('{"BIG":""}'))},  # exactly the bound
    ],
    ids=["empty", "one", "empty-value", "unicode", "newlines-quotes", "not-utf8", "5000-variables", "at-the-bound"],
)
def test_a_record_carries_the_variables_and_not_a_byte_more_is_read(tmp_path, variables):
    record = channel.encode(variables)
    assert len(record) <= channel.RECORD_LIMIT + channel.LENGTH.size
    assert through_a_file(tmp_path, record, then=b"the rank's own input") == (variables, b"the rank's own input")


def test_an_environment_past_the_bound_is_not_sent():
    size = channel.RECORD_LIMIT + len('{"BIG":""}')
    with pytest.raises(channel.ChannelError) as refused:
        channel.encode({"BIG": "x" * channel.RECORD_LIMIT})
    assert str(refused.value) == (
        f"the job's environment is {size} bytes as JSON; a remote rank takes at most {channel.RECORD_LIMIT}: set "
        "fewer or shorter variables (--env)"
    )


NOT_VARIABLES = "the environment record is not an object of variable names to values"


def framed(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


@pytest.mark.parametrize(
    "data, problem",
    [
        (b"", "no environment record on stdin (0 of 4 header bytes)"),
        (b"\x00\x00", "no environment record on stdin (2 of 4 header bytes)"),
        (b"\xff\xff\xff\xff" + b"{}", f"an environment record of 4294967295 bytes; at most {1 << 20} are taken"),
        ((1 << 20 | 1).to_bytes(4, "big"), f"an environment record of {(1 << 20) + 1} bytes; at most {1 << 20} are"),
        (b"\x00\x00\x00\x10{}", "the environment record ended early (2 of 16 bytes)"),
        (framed(b"{a}"), "the environment record is not JSON: "),
        (framed(b"[]"), NOT_VARIABLES),
        (framed(b'{"A":1}'), NOT_VARIABLES),
        (framed(b'{"A=B":""}'), NOT_VARIABLES),
        (framed(b'{"":""}'), NOT_VARIABLES),
        (framed(b'{"A":"\\u0000"}'), NOT_VARIABLES),
    ],
    ids=["nothing", "short-header", "huge-length", "one-past-the-bound", "short-body", "not-json", "a-list",
         "a-number", "a-name-with-equals", "an-empty-name", "a-nul"],
)  # fmt: skip
def test_a_record_that_is_not_whole_or_not_variables_is_refused(tmp_path, data, problem):
    with pytest.raises(channel.ChannelError) as refused:
        through_a_file(tmp_path, data)
    assert str(refused.value).startswith(problem), refused.value


def test_the_workers_session_keeps_its_own_variables():
    """As sshd's SetEnv and login variables did over SendEnv: the worker's PATH, HOME and PYTHONPATH stay its own."""
    session = {"HOME": "/home/mpiuser", "PATH": "/opt/venv/bin:/usr/bin", "USER": "mpiuser"}
    sent = {"HOME": "/root", "PATH": "/elsewhere", "API_KEY": "sk", "HOROVOD_STACK_RENDEZVOUS_TOKEN": "t"}
    assert channel.merged(session, sent) == {**session, "API_KEY": "sk", "HOROVOD_STACK_RENDEZVOUS_TOKEN": "t"}


def test_the_command_lines_hold_the_command_and_no_value():
    """What `ps` shows on either node: this Python, this file, and the rank's command, quoted once per shell."""
    inner = "cd /workdir > /dev/null 2>&1 ; env HOROVOD_RANK=1 python 'my script.py'"
    remote = channel.receiving(inner)
    assert shlex.split(remote) == ["exec", channel.sys.executable, "-I", channel.PROGRAM, "receive", inner]
    local = channel.sending(f"ssh -o PasswordAuthentication=no node_2 -p 12345 {shlex.quote(remote)}")
    assert shlex.split(local) == [
        *(channel.sys.executable, "-I", channel.PROGRAM, "send"),
        *("ssh", "-o", "PasswordAuthentication=no", "node_2", "-p", "12345", remote),
    ]
