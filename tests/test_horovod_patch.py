"""The stack's Horovod build (docker/patch-horovod-source.sh) on two real ranks, under horovodrun (Gloo) and under
mpirun: late ranks, quiet periods, out-of-order synchronize and join still give the right sums, and an idle rank's
background thread no longer negotiates every cycle (1 ms) but about every idle wait (50 ms); a peer that reaches a
rendezvous later than the collective timeout is still waited for. And the runner patch (docker/horovod-runner/patch.py)
over this checkout's installed runner: pinned host keys, no values on command lines, a remote rank's environment on
the ssh channel's stdin."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.bench import ranks
from tests.extras import needs

SCRIPT = Path(__file__).parent / "horovod_patch" / "collectives.py"
LATE_PEER = Path(__file__).parent / "horovod_patch" / "late_peer.py"
REMOTE_RANK = Path(__file__).parent / "horovod_patch" / "remote_rank.py"


def idle_cycles(peer: str, out: Path, **env: str) -> int:
    """Runs the script on 2 ranks (`hvd-gloo`: horovodrun --gloo, `hvd-mpi`: mpirun) and returns the cycles its
    idle second took."""
    env = {"HOROVOD_TIMELINE": "DYNAMIC", "OMPI_MCA_mpi_yield_when_idle": "1", **env}
    result = subprocess.run(
        [*ranks.launcher_argv(peer, 2, env), sys.executable, str(SCRIPT), str(out)],
        env=ranks.bench_env(env),
        cwd=ranks.REPO,
        capture_output=True,
        text=True,
        timeout=180,
        start_new_session=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert json.loads((out / "result.json").read_text())["ok"]
    return (out / "timeline.json").read_text().count('"CYCLE_START"')


@pytest.mark.integration
@pytest.mark.parametrize("peer", ["hvd-gloo", "hvd-mpi"])
def test_collectives_right_and_an_idle_rank_negotiates_seldom(peer, tmp_path):
    cycles = idle_cycles(peer, tmp_path)
    print(f"{peer}: {cycles} background-thread cycles in an idle second (Horovod's own loop: about 1000)")
    assert 5 <= cycles <= 100, cycles


@pytest.mark.integration
def test_idle_wait_zero_is_horovods_own_loop(tmp_path):
    """HOROVOD_STACK_IDLE_WAIT_MS=0, the peers bench's 'no idle wait' configuration: a cycle every millisecond, about
    1000 in the idle second on a quiet machine. The bound is the idle-wait test's upper one (100), not a rate: a busy
    CI machine gave 252, and a loop that still waited 50 ms between cycles gives about 20."""
    cycles = idle_cycles("hvd-gloo", tmp_path, HOROVOD_STACK_IDLE_WAIT_MS="0")
    print(f"hvd-gloo, HOROVOD_STACK_IDLE_WAIT_MS=0: {cycles} cycles in an idle second")
    assert cycles > 100, cycles


@pytest.mark.integration
def test_a_peer_later_than_the_collective_timeout_still_meets_the_rendezvous():
    """HOROVOD_STACK_RENDEZVOUS_TIMEOUT_SECONDS: rank 1 arrives 8 s after rank 0 with a 3 s collective timeout (a
    worker joining an elastic job while its torch starts); unpatched, rank 0 aborted at 3 s ("Wait timeout")."""
    env = {"HOROVOD_GLOO_TIMEOUT_SECONDS": "3", "HOROVOD_STACK_RENDEZVOUS_TIMEOUT_SECONDS": "60"}
    result = subprocess.run(
        [*ranks.launcher_argv("hvd-gloo", 2, env), sys.executable, str(LATE_PEER), "8"],
        env=ranks.bench_env(env),
        cwd=ranks.REPO,
        capture_output=True,
        text=True,
        timeout=180,
        start_new_session=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} of 2: rendezvous ok, allreduce sum 3" in result.stdout, result.stdout[-3000:]


def load_module(path: Path, name: str):
    import importlib.util

    found = importlib.util.spec_from_file_location(name, path)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def patched_runner(tmp_path: Path):
    """A copy of this checkout's installed Horovod runner with docker/horovod-runner/patch.py applied (twice: the
    second run must change nothing), its modules loaded from there."""
    import horovod

    installed = Path(horovod.__file__).parent
    shutil.copytree(installed / "runner", tmp_path / "horovod" / "runner")
    patch = [sys.executable, str(ranks.REPO / "docker" / "horovod-runner" / "patch.py"), str(tmp_path)]
    subprocess.run(patch, check=True, capture_output=True)
    first = {path: path.read_bytes() for path in (tmp_path / "horovod").rglob("*.py")}
    subprocess.run(patch, check=True, capture_output=True)
    assert {path: path.read_bytes() for path in (tmp_path / "horovod").rglob("*.py")} == first
    return tmp_path / "horovod" / "runner"


def load_gloo_run(runner: Path, monkeypatch: pytest.MonkeyPatch):
    """The patched gloo_run, importing the patched copy's env_channel (this checkout's .venv may predate it)."""
    channel = load_module(runner / "common/util/env_channel.py", "horovod.runner.common.util.env_channel")
    monkeypatch.setitem(sys.modules, "horovod.runner.common.util.env_channel", channel)
    return load_module(runner / "gloo_run.py", "patched_gloo_run")


@needs("horovod")
def test_the_runner_patch_pins_host_keys_and_keeps_values_off_command_lines(tmp_path, monkeypatch):
    """docker/horovod-runner/patch.py over this checkout's installed Horovod runner: elastic ranks' ssh no longer
    trusts any host key nor sends variables (SendEnv), and a rank's command line holds no variable horovodrun has
    itself (a secret setting)."""
    from horovod.runner.common.util.hosts import SlotInfo

    runner = patched_runner(tmp_path)
    remote = load_module(runner / "util/remote.py", "patched_remote")
    command = remote.get_ssh_command("true", "node_2", port=12345)
    assert command.startswith("ssh -o PasswordAuthentication=no node_2 -p 12345 "), command
    assert "StrictHostKeyChecking" not in command and "SendEnv" not in command, command

    monkeypatch.setenv("API_KEY", "sk-SECRET123")
    monkeypatch.setenv("HOROVOD_STACK_RENDEZVOUS_TOKEN", "the-jobs-secret")
    gloo_run = load_gloo_run(runner, monkeypatch)
    env = {**os.environ, "HOROVOD_FUSION_THRESHOLD": "0"}  # one of horovodrun's own settings, not in its environment
    line = gloo_run._slot_info_to_command_fn("python t.py", env)(SlotInfo("node_2", 1, 0, 1, 2, 1, 2))
    assert "sk-SECRET123" not in line and "API_KEY" not in line, line
    assert "the-jobs-secret" not in line, line  # the rendezvous secret travels as any other inherited value
    assert "HOROVOD_FUSION_THRESHOLD=0" in line and "HOROVOD_RANK=1" in line


def session_like_sshd(local_command: str, host: str, port=None, identity_file=None, timeout_s=None) -> str:
    """Stands in for the ssh command horovodrun runs for a remote rank: as sshd does, a fresh session environment
    (HOME, PATH) in which the login shell runs the command string. Its stdin is ssh's, as ssh forwards it."""
    return f"env -i HOME=/home/mpiuser PATH={shlex.quote(os.environ['PATH'])} sh -c {local_command}"


@needs("horovod")
def test_a_remote_ranks_environment_arrives_on_stdin_whatever_its_size(tmp_path, monkeypatch, capfd):
    """The patched runner's command for a rank on another host (its ssh stood in for by a fresh session on this one):
    300 variables with quotes and newlines and the secret arrive, the session's HOME stays, the rank's stdin is empty
    and its exit status passes through; no value is on a command line meanwhile, and no process of the channel stays
    in the rank's process tree."""
    import threading
    import types

    import psutil
    from horovod.runner.common.util.hosts import SlotInfo

    expected = load_module(REMOTE_RANK, "remote_rank").expected
    for i in range(300):
        monkeypatch.setenv(f"HST_{i}", expected(i))
    secret = f"sk-SECRET-{os.urandom(6).hex()}"
    monkeypatch.setenv("API_KEY", secret)
    monkeypatch.setenv("HOME", "/root-of-the-driver")
    gloo_run = load_gloo_run(patched_runner(tmp_path / "site"), monkeypatch)
    monkeypatch.setattr(gloo_run, "get_remote_command", session_like_sshd)
    monkeypatch.setattr(gloo_run.network, "resolve_host_address", lambda host: "198.51.100.2")
    monkeypatch.setattr(gloo_run.network, "get_local_host_addresses", lambda: {"127.0.0.1"})  # node_2 is elsewhere
    settings = types.SimpleNamespace(
        elastic=True, ssh_port=12345, ssh_identity_file=None, verbose=False, output_filename=None, num_proc=2,
        prefix_output_with_timestamp=False,
    )  # fmt: skip
    execute = gloo_run._exec_command_fn(settings)
    slot = SlotInfo("node_2", 1, 0, 1, 2, 1, 2)
    pid_file = tmp_path / "rank.pid"

    def rank_command(status: int, seconds: float) -> str:
        run = f"{shlex.quote(sys.executable)} {REMOTE_RANK} 300 {status} {seconds} {pid_file}"
        return gloo_run._slot_info_to_command_fn(run, dict(os.environ))(slot)

    exit_status, _ = execute(rank_command(7, 0), slot, [])
    said = capfd.readouterr().out
    assert f"300 of 300 right; API_KEY {secret}; HOME /home/mpiuser; stdin ''" in said, said
    assert exit_status == 7

    pid_file.unlink()
    result: dict[str, int] = {}
    held = rank_command(0, 300)
    runner = threading.Thread(target=lambda: result.update(status=execute(held, slot, [])[0]), daemon=True)
    runner.start()
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert runner.is_alive() and time.monotonic() < deadline, capfd.readouterr()
        time.sleep(0.1)
    rank = psutil.Process(int(pid_file.read_text()))
    try:
        argvs = [process.info["cmdline"] or [] for process in psutil.process_iter(["cmdline"])]
        assert [argv for argv in argvs if secret in " ".join(argv) or "second line" in " ".join(argv)] == []
        assert [argv for argv in argvs if str(REMOTE_RANK) in argv]  # the check's control: the rank is seen
        # Both ends exec'd: between the runner's shell, ssh and the rank no process of ours stays, so the runner's
        # termination of the process tree meets the processes it met before.
        assert [argv for argv in argvs if argv[1:2] == ["-I"] and argv[2].endswith("env_channel.py")] == []
    finally:
        rank.terminate()
        runner.join(timeout=30)
    assert result == {"status": 128 + signal.SIGTERM}  # a rank ended by a signal: its status as a shell says it


@needs("horovod")
def test_the_runner_patch_refuses_a_runner_it_does_not_know(tmp_path):
    """A Horovod whose runner changed where an edit applies fails the patch, naming the file to check, rather than
    shipping half patched."""
    import horovod

    shutil.copytree(Path(horovod.__file__).parent / "runner", tmp_path / "horovod" / "runner")
    server = tmp_path / "horovod/runner/http/http_server.py"
    server.write_text(server.read_text().replace("SINGLE_REQUEST_TIMEOUT\n", "REQUEST_TIMEOUT\n"))
    done = subprocess.run([sys.executable, str(ranks.REPO / "docker" / "horovod-runner" / "patch.py"), str(tmp_path)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode != 0
    assert "this Horovod's runner changed; check docker/horovod-runner/patch.py" in done.stderr, done.stderr
