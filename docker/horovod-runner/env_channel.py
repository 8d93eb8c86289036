"""An elastic job's environment for its remote ranks, over the ssh channel's stdin (installed beside Horovod's runner
utilities as horovod.runner.common.util.env_channel; patched into gloo_run's remote command by patch.py).

ssh's own way (SendEnv, with AcceptEnv on the worker) has a limit: OpenSSH's sshd takes at most 128 variables a
session and ignores the rest without a word, so a remote rank of a job with a large environment lost variables (on
the test hosts, 33 of 140 --env values), the job's secret too where it came late. Here horovodrun's ssh runs behind
the sender, and the remote command behind the receiver:

    PYTHON -I env_channel.py send ssh ... HOST 'exec PYTHON -I env_channel.py receive '"'"'cd PWD; COMMAND'"'"''

The sender writes horovodrun's exportable environment (Horovod's env.is_exportable) into a pipe as one record (a
4-byte big-endian length, then a JSON object of names to values, at most RECORD_LIMIT bytes; the pipe made large
enough to hold it, else a forked writer feeds it) and becomes ssh with that pipe as its stdin; ssh carries it to the
receiver over the authenticated channel. The receiver reads that one record, sets each variable the worker's ssh
session has not set itself (USER, HOME, PATH, sshd_config's SetEnv: as with SendEnv, the worker's own values win),
points stdin at /dev/null and becomes `/bin/sh -c COMMAND`. Both exec, so no process of ours stays: a rank's exit
status is ssh's, and horovodrun's termination of the process tree meets ssh as before. No value is on a command line
or in a file. `-I`: neither side imports from the job's working directory or PYTHONPATH.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import struct
import sys
from collections.abc import Mapping

RECORD_LIMIT = 1 << 20
"""The most bytes of environment (as JSON) a remote rank takes: far more than any job's, far less than a worker's
memory."""
LENGTH = struct.Struct(">I")
PROGRAM = os.path.abspath(__file__)
"""This file: the same path on every node, as horovodrun assumes of its own Python (one image)."""


class ChannelError(Exception):
    """A record that cannot be sent or was not received whole; its message says which and what to do."""


def encode(variables: Mapping[str, str]) -> bytes:
    """The record of `variables`. ASCII JSON: a value Python decoded with surrogateescape (bytes that are not UTF-8)
    travels as its escapes and comes back the same."""
    body = json.dumps(dict(variables), ensure_ascii=True, separators=(",", ":")).encode("ascii")
    if len(body) > RECORD_LIMIT:
        raise ChannelError(
            f"the job's environment is {len(body)} bytes as JSON; a remote rank takes at most {RECORD_LIMIT}: "
            "set fewer or shorter variables (--env)"
        )
    return LENGTH.pack(len(body)) + body


def read_exactly(fd: int, count: int) -> bytes:
    chunks, got = [], 0
    while got < count:
        chunk = os.read(fd, min(count - got, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def decode(fd: int) -> dict[str, str]:
    """The variables of the one record readable from `fd`, read to its end and not a byte further."""
    header = read_exactly(fd, LENGTH.size)
    if len(header) < LENGTH.size:
        raise ChannelError(f"no environment record on stdin ({len(header)} of {LENGTH.size} header bytes)")
    (length,) = LENGTH.unpack(header)
    if length > RECORD_LIMIT:
        raise ChannelError(f"an environment record of {length} bytes; at most {RECORD_LIMIT} are taken")
    body = read_exactly(fd, length)
    if len(body) < length:
        raise ChannelError(f"the environment record ended early ({len(body)} of {length} bytes)")
    try:
        variables = json.loads(body)
    except ValueError as error:
        raise ChannelError(f"the environment record is not JSON: {error}") from None
    if not isinstance(variables, dict) or not all(
        isinstance(name, str) and isinstance(value, str) and valid(name, value) for name, value in variables.items()
    ):
        raise ChannelError("the environment record is not an object of variable names to values")
    return variables


def valid(name: str, value: str) -> bool:
    return bool(name) and "=" not in name and "\0" not in name and "\0" not in value


def receiving(command: str) -> str:
    """The remote shell's command line that runs `command` once the environment has arrived."""
    return f"exec {shlex.quote(sys.executable)} -I {shlex.quote(PROGRAM)} receive {shlex.quote(command)}"


def sending(ssh_command: str) -> str:
    """The local shell's command line that runs `ssh_command` (whose remote command is `receiving`'s) with this
    process's environment on its stdin."""
    return f"{shlex.quote(sys.executable)} -I {shlex.quote(PROGRAM)} send {ssh_command}"


def exportable(environ: Mapping[str, str]) -> dict[str, str]:
    """What horovodrun hands its ranks of its environment: Horovod's own rule (no BASH_FUNC_*, OLDPWD, *CUDA_VISIBLE_
    DEVICES or its HOROVOD_SECRET_KEY)."""
    from horovod.runner.common.util import env as env_util

    return {name: value for name, value in environ.items() if env_util.is_exportable(name)}


def merged(session: Mapping[str, str], sent: Mapping[str, str]) -> dict[str, str]:
    """The rank's environment: the sent variables, under those the worker's ssh session set itself."""
    return {**sent, **session}


def default_signals() -> None:
    """Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across exec: the command gets the
    defaults it would have had without this step."""
    for number in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(number, signal.SIG_DFL)


def holds(fd: int, size: int) -> bool:
    """Whether the pipe `fd` holds `size` bytes unread (its capacity raised to that where it was less)."""
    try:
        capacity = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
        if capacity < size:
            capacity = fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
        return capacity >= size
    except OSError:  # past /proc/sys/fs/pipe-max-size, or the user's pipe pages spent
        return False


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def send(ssh_argv: list[str]) -> None:
    record = encode(exportable(os.environ))
    read_end, write_end = os.pipe()
    if holds(write_end, len(record)):
        write_all(write_end, record)  # at once: no writer process, which would be ssh's child, unreaped
    elif os.fork() == 0:  # a writer beside ssh, where the pipe cannot hold the record
        os.close(read_end)
        try:
            write_all(write_end, record)
        except BrokenPipeError:  # ssh ended first; it says why
            pass
        os._exit(0)
    os.close(write_end)
    os.dup2(read_end, 0)
    os.close(read_end)
    default_signals()
    try:
        os.execvp(ssh_argv[0], ssh_argv)
    except OSError as error:
        raise ChannelError(f"cannot run {ssh_argv[0]}: {error.strerror}") from None


def receive(command: str) -> None:
    environment = merged(os.environ, decode(0))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    default_signals()
    os.execve("/bin/sh", ["/bin/sh", "-c", command], environment)


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["send"] and len(argv) > 1:
            send(argv[1:])
        elif argv[:1] == ["receive"] and len(argv) == 2:
            receive(argv[1])
        else:
            print("usage: env_channel.py send SSH_COMMAND... | receive COMMAND", file=sys.stderr)
            return 2
    except ChannelError as error:
        print(f"horovod-stack: {error} (docker/horovod-runner/env_channel.py)", file=sys.stderr)
        return 1
    return 0  # not reached: both exec

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
