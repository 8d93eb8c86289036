"""`docker compose up` runs a real multi-container Horovod cluster on this host, and the image keeps no secret.

Needs the Docker engine and the image (scripts/test.sh prepares both through scripts/build-images.sh).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import textwrap
import time
import uuid
from pathlib import Path

import docker
import pytest

from app import rank_error
from launcher.core import stall
from launcher.core.protocol import LOST_PREFIX, lost_driver_message
from tests.logwait import wait_for_line

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
IMAGE = os.environ.get("IMAGE", "horovod-stack:latest")
PRIVATE_KEY_MARK = b"PRIVATE KEY-----"
USER_SCRIPT = REPO / "tests" / "user_script"
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@pytest.fixture(scope="module")
def engine() -> docker.DockerClient:
    client = docker.from_env()
    client.images.get(IMAGE)  # fails with ImageNotFound naming the image if scripts/build-images.sh was not run
    return client


def project_containers(engine, project: str, **filters):
    return engine.containers.list(all=True, filters={"label": f"com.docker.compose.project={project}", **filters})


class ComposeRun:
    """`docker compose up` as a user types it, in a copy of the checkout (so no local .env leaks in), under a
    project name of its own so `down -v` removes only what this run made."""

    def __init__(self, workdir: Path, **settings: str) -> None:
        self.project = f"hst-test-{uuid.uuid4().hex[:8]}"
        self.workdir = workdir
        for tracked in subprocess.run(
            ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.split():
            if (REPO / tracked).is_file():
                (workdir / tracked).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / tracked, workdir / tracked)
        assert not (workdir / ".env").exists()
        env = {key: value for key, value in os.environ.items() if not key.startswith("COMPOSE_")}
        self.env = {**env, "COMPOSE_PROJECT_NAME": self.project, "IMAGE": IMAGE, **settings}

    def compose(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        result = subprocess.run(
            ["docker", "compose", *args],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        # Compose clears each line with an escape sequence even when not writing to a terminal.
        result.stdout, result.stderr = (ANSI_ESCAPE.sub("", text) for text in (result.stdout, result.stderr))
        return result

    def start(self, *args: str, log: Path) -> subprocess.Popen:
        """`docker compose ARGS` in the background, its output (escapes and all) into `log`."""
        return subprocess.Popen(
            ["docker", "compose", *args],
            cwd=self.workdir,
            env=self.env,
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
        )

    def read_shared(self, path: str, binary: bool = False) -> str | bytes:
        return subprocess.run(
            [
                "docker",
                "run",
                "--rm",
                "-v",
                f"{self.project}_shared:/shared",
                "--entrypoint",
                "cat",
                IMAGE,
                f"/shared/{path}",
            ],
            capture_output=True,
            text=not binary,
            check=True,
        ).stdout

    def down(self) -> None:
        self.compose("down", "--volumes", "--remove-orphans", timeout=300)


@pytest.fixture
def compose_run(tmp_path):
    runs: list[ComposeRun] = []

    def make(**settings):
        workdir = tmp_path / f"checkout-{len(runs)}"
        workdir.mkdir()
        runs.append(ComposeRun(workdir, **settings))
        return runs[-1]

    yield make
    for run in runs:
        run.down()


def test_plain_compose_up_trains_across_containers_and_returns(engine, compose_run):
    """`docker compose up`, typed exactly so: no .env, no profile, no --exit-code-from."""
    run = compose_run()
    result = run.compose("up")  # the timeout (600 s) is the bound: a stack that never stops fails here
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert "2/2 workers answer over ssh" in output
    launcher_lines = [line for line in output.splitlines() if line.startswith("launcher-1") and "|" in line]
    assert "job succeeded (exit status 0)" in launcher_lines[-2], launcher_lines[-3:]
    assert "results: /shared/runs/" in launcher_lines[-1] and "curves.png" in launcher_lines[-1], launcher_lines[-3:]
    run_folder = launcher_lines[-1].split("results: ")[1].split()[0]
    print(f"\ncompose run folder: {run_folder} (volume {run.project}_shared)")
    assert run.read_shared("runs/latest/curves.png", binary=True)[:8] == b"\x89PNG\r\n\x1a\n"
    # The last line's one command copies the run out of the volume, from the stopped launcher container.
    where, copy = launcher_lines[-1].split(" in ", 1)[1].split("; copy it here: ")
    assert where == f"the volume {run.project}_shared", launcher_lines[-1]
    assert copy == f"docker compose cp launcher:{run_folder} ./runs/", launcher_lines[-1]
    copied = run.compose(*shlex.split(copy)[2:])
    assert copied.returncode == 0, copied.stderr
    home = run.workdir / "runs" / run_folder.rsplit("/", 1)[1]
    assert (home / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len((home / "metrics.jsonl").read_text().splitlines()) == 5
    assert {path.stat().st_uid for path in home.rglob("*")} == {os.getuid()}  # the invoking user's, not the job's

    epochs = [json.loads(line) for line in run.read_shared("runs/latest/metrics.jsonl").splitlines()]
    assert [epoch["epoch"] for epoch in epochs] == [1, 2, 3, 4, 5]
    assert epochs[-1]["val_accuracy"] >= 0.90, epochs[-1]
    summary = json.loads(run.read_shared("runs/latest/summary.json"))
    assert summary["world_size"] == 2
    hosts = [rank["host"] for rank in summary["ranks"]]
    assert len(set(hosts)) == 2, f"both ranks ran in one container: {hosts}"
    assert len({rank["digest"] for rank in summary["ranks"]}) == 1, "ranks ended with different parameters"
    worker_ids = {
        c.id[:12] for c in project_containers(engine, run.project) if c.labels["com.docker.compose.service"] == "worker"
    }
    assert set(hosts) == worker_ids, "ranks did not run in the worker containers"

    assert project_containers(engine, run.project, status="running") == []
    for container in project_containers(engine, run.project):  # what NCCL asks of a container
        assert {"Name": "stack", "Soft": 64 * 1024**2, "Hard": 64 * 1024**2} in container.attrs["HostConfig"]["Ulimits"]
        assert container.attrs["HostConfig"]["CapDrop"] == ["ALL"]
        if container.labels["com.docker.compose.service"] == "worker":
            assert sorted(container.attrs["HostConfig"]["CapAdd"]) == ["IPC_LOCK", "SYS_PTRACE"]
            # the cluster's public key only, read-only; no folder of host keys any worker could write
            assert {(m["Destination"], m["RW"]) for m in container.attrs["Mounts"] if m["Type"] == "volume"} == {
                ("/shared", True),
                ("/cluster/ssh", False),
            }, container.attrs["Mounts"]
    launcher = next(
        c for c in project_containers(engine, run.project) if c.labels["com.docker.compose.service"] == "launcher"
    )
    assert not launcher.attrs["HostConfig"]["CapAdd"], launcher.attrs["HostConfig"]["CapAdd"]
    assert not any(PRIVATE_KEY_MARK.decode() in variable for variable in launcher.attrs["Config"]["Env"])
    # What the workers mount holds no private key: it stayed in the launcher's container.
    workers_folder = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "-v",
            f"{run.project}_cluster-ssh:/keys:ro",
            "--entrypoint",
            "sh",
            IMAGE,
            "-c",
            "ls /keys; cat /keys/*",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert workers_folder.startswith("authorized_keys\n") and PRIVATE_KEY_MARK.decode() not in workers_folder, (
        workers_folder
    )
    run.down()
    assert project_containers(engine, run.project) == []


def test_failing_job_returns_by_itself_with_its_error(engine, compose_run):
    """A job that fails ends `up` too (workers stop whatever the outcome); .env copied from .env.example."""
    run = compose_run(TRAIN_ARGS="--epochs 0")
    shutil.copy(run.workdir / ".env.example", run.workdir / ".env")
    result = run.compose("up")
    output = result.stdout + result.stderr
    assert "error: --epochs must be at least 1 (got 0)" in output, output[-5000:]
    assert "job FAILED (exit status" in output, output[-5000:]
    assert project_containers(engine, run.project, status="running") == []
    exit_codes = {
        c.labels["com.docker.compose.service"]: c.attrs["State"]["ExitCode"]
        for c in project_containers(engine, run.project)
    }
    assert exit_codes["launcher"] != 0 and exit_codes["worker"] == 0, exit_codes

    # Scripts get the job's status from --exit-code-from (plain `up` returns 0 in Compose 2.26).
    again = run.compose("up", "--exit-code-from", "launcher")
    assert again.returncode == exit_codes["launcher"], (again.stdout + again.stderr)[-3000:]
    assert project_containers(engine, run.project, status="running") == []


def test_users_script_runs_from_workdir_with_its_exit_status(engine, compose_run):
    """TRAIN_COMMAND + WORKDIR through scripts/compose-up.sh (its image build stood in for: the image is there): the
    user's own Horovod script on both workers; its status is the script's, and the run's folder (Horovod's timeline,
    TIMELINE=1) ends up in ./runs on the host."""
    run = compose_run(TRAIN_COMMAND="python allreduce_train.py --exit-status 3", WORKDIR=str(USER_SCRIPT), TIMELINE="1")
    (run.workdir / "scripts" / "build-images.sh").write_text("#!/bin/sh\n")
    result = subprocess.run(
        [run.workdir / "scripts" / "compose-up.sh"], env=run.env, capture_output=True, text=True, timeout=600
    )
    output = ANSI_ESCAPE.sub("", result.stdout + result.stderr)
    assert result.returncode == 3, output[-5000:]
    results, status = result.stdout.splitlines()[-2:]
    assert status == "job exit status: 3", result.stdout[-3000:]
    assert re.fullmatch(r"results: \./runs/[\w.-]+ \(timeline\.json\)", results), results
    home = run.workdir / results.split()[1]
    assert (home / "timeline.json").stat().st_size > 0 and home.stat().st_uid == os.getuid()
    assert project_containers(engine, run.project) == []  # the script's `down` removed them
    assert "-wdir /workdir python allreduce_train.py --exit-status 3" in output
    for rank in (0, 1):
        assert f"user-script rank {rank} of 2 on " in output
    assert output.count("(2 hosts, 1 rank(s) on this one): allreduce sum 3 ok") == 2
    assert "job FAILED (exit status 3)" in output


def compose_secrets_example() -> str:
    """The compose.secrets.yaml docs/compose.md shows (a code block inside a list item, hence indented)."""
    doc = (REPO / "docs" / "compose.md").read_text()
    start = doc.index("```yaml\n  services:\n    launcher:\n      secrets:") + len("```yaml\n")
    return textwrap.dedent(doc[start : doc.index("```", start)])


def test_a_compose_secret_reaches_every_rank_and_no_command_line_or_inspect(engine, compose_run):
    """docs/compose.md's compose.secrets.yaml: the value comes from the shell's environment through Compose's own
    secret, every rank gets it, and neither the output nor any container's configuration holds it."""
    value = f"sk-compose-{uuid.uuid4().hex}"
    run = compose_run(
        TRAIN_COMMAND="python secret_digest.py WANDB_API_KEY --hold 0", WORKDIR=str(USER_SCRIPT), WANDB_API_KEY=value
    )
    (run.workdir / "compose.secrets.yaml").write_text(compose_secrets_example())
    result = run.compose("-f", "compose.yaml", "-f", "compose.secrets.yaml", "up", "--exit-code-from", "launcher")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    digest = hashlib.sha256(value.encode()).hexdigest()
    for rank in (0, 1):
        assert f"secret rank {rank} of 2: WANDB_API_KEY sha256 {digest}" in output, output[-3000:]
    assert "-x WANDB_API_KEY" in output and value not in output
    for container in project_containers(engine, run.project):
        assert value not in json.dumps(container.attrs), container.name


def test_a_stalled_job_shows_every_ranks_stack_and_fails_when_asked(engine, compose_run, tmp_path, measured):
    """rank 1 blocks in a function of its own, rank 0 waits in an allreduce: the stall watch names both. The job is
    elastic (horovodrun, its rendezvous in the launcher container), and a stranger on the project's network sends a
    request to every port of the launcher every 5 s: the refusals are said once a minute, and they are no progress,
    so the stall is still seen."""
    run = compose_run(
        TRAIN_COMMAND="python stall.py", WORKDIR=str(USER_SCRIPT), STALL_TIMEOUT="20", STALL_ACTION="fail",
        ELASTIC_MIN_WORKERS="2",
    )  # fmt: skip
    log = tmp_path / "compose.log"
    process = run.start("up", "--exit-code-from", "launcher", log=log)
    stranger = None
    try:
        started = wait_for_line(log, "stall-script rank 1 of 2 started", process, timeout=400)
        address, ports = launcher_ports(engine, run)
        stranger = engine.containers.run(
            IMAGE,
            ["python", "/probe/rendezvous_probe.py", "--every", "5", address, MARKER, *ports],
            network=f"{run.project}_default",
            detach=True,
            volumes={str(USER_SCRIPT): {"bind": "/probe", "mode": "ro"}},
        )
        said = wait_for_line(log, "the job looks stalled: no output and no new metrics for", process, timeout=120)
        process.wait(timeout=120)
        probes = stranger.logs().decode().count("{")
    finally:
        if stranger is not None:
            stranger.remove(force=True)
        if process.poll() is None:
            process.kill()
    output = ANSI_ESCAPE.sub("", log.read_text())
    refusals = output.count(stall.REFUSAL_MARK)
    measured(f"stalled elastic job with a stranger's requests every 5 s: stall said {said - started:.0f} s after the "
             f"ranks started; {probes} rounds of requests, {refusals} refusal line(s)")  # fmt: skip
    assert process.returncode != 0, output[-5000:]
    assert probes >= 3, output[-3000:]  # the stranger kept asking while the job hung
    assert 1 <= refusals <= 2, output[-5000:]  # once a minute, whatever it sends
    assert re.search(r"rank 1 \([0-9.]+ pid \d+\) in wait_for_data at stall.py:\d+", output), output[-5000:]
    assert re.search(r"rank 0 \([0-9.]+ pid \d+\) in \w+ at mpi_ops.py:\d+, from main at stall.py", output)
    assert "error: the job stalled: no output and no new metrics for" in output
    assert project_containers(engine, run.project, status="running") == []


def test_users_script_failing_on_rank_1_fails_the_job_with_its_traceback(engine, compose_run):
    run = compose_run(TRAIN_COMMAND="python allreduce_train.py --fail-on-rank 1", WORKDIR=str(USER_SCRIPT))
    result = run.compose("up")
    output = result.stdout + result.stderr
    assert "Traceback (most recent call last)" in output, output[-5000:]
    assert "RuntimeError: user script failed on purpose on rank 1" in output
    # the agent's cause, from rank 1's record (app/rank_error.py), which the job's output no longer shows
    cause = re.search(r"error: rank 1 on \S+: RuntimeError: user script failed on purpose on rank 1", output)
    assert cause, output[-5000:]
    print(f"\nthe agent's cause: {cause[0]}")
    assert rank_error.MARKER not in output
    assert "job FAILED (exit status" in output
    assert project_containers(engine, run.project, status="running") == []
    run.down()
    assert project_containers(engine, run.project) == []


def test_users_script_missing_from_workdir_is_named_before_mpirun(engine, compose_run):
    run = compose_run(TRAIN_COMMAND="python train_missing.py", WORKDIR=str(USER_SCRIPT))
    result = run.compose("up")
    output = result.stdout + result.stderr
    assert re.search(
        r"error: [0-9.]+: cannot start `python train_missing\.py` in /workdir: script train_missing\.py "
        "is not there; set WORKDIR to the folder that holds your code",
        output,
    ), output[-3000:]
    assert "job FAILED (exit status 2)" in output and "mpirun exited" not in output
    assert project_containers(engine, run.project, status="running") == []


def test_derived_image_with_the_users_code_runs_through_compose(engine, compose_run, tmp_path):
    """The other way to bring code: an image FROM horovod-stack:latest that COPYs it (docs/compose.md)."""
    (tmp_path / "Dockerfile").write_text(f"FROM {IMAGE}\nCOPY allreduce_train.py /opt/user-code/\n")
    shutil.copy(USER_SCRIPT / "allreduce_train.py", tmp_path)
    tag = f"hst-derived:{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "build", "-q", "-t", tag, str(tmp_path)], check=True, capture_output=True)
    try:
        run = compose_run(IMAGE=tag, TRAIN_COMMAND="python /opt/user-code/allreduce_train.py")
        result = run.compose("up", "--exit-code-from", "launcher")
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-5000:]
        assert "user-script rank 1 of 2 on " in output and "job succeeded (exit status 0)" in output
        run.down()
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def horovod_rank(container) -> int | None:
    """The Horovod rank of the trainer running in a worker container (from its environment), if any."""
    found = container.exec_run(
        [
            "bash",
            "-c",
            'for p in $(pgrep -f "app.train"); do tr "\\0" "\\n" < /proc/$p/environ | grep "^HOROVOD_RANK="; done',
        ],
        user="mpiuser",
    )
    ranks = {int(line.split("=")[1]) for line in found.output.decode().split()}
    return ranks.pop() if len(ranks) == 1 else None


MARKER = "/tmp/hst-rendezvous-ran-code"


def launcher_container(engine, run: ComposeRun):
    return next(
        c for c in project_containers(engine, run.project) if c.labels["com.docker.compose.service"] == "launcher"
    )


def listening(container) -> list[str]:
    """The address:port pairs a container listens on (TCP)."""
    sockets = container.exec_run(["ss", "-Hltn"]).output.decode().split("\n")
    return [line.split()[3] for line in sockets if line.strip()]


def launcher_ports(engine, run: ComposeRun) -> tuple[str, list[str]]:
    """The launcher container's address on the project's network, and every port it listens on."""
    launcher = launcher_container(engine, run)
    address = launcher.attrs["NetworkSettings"]["Networks"][f"{run.project}_default"]["IPAddress"]
    return address, sorted({address_port.rsplit(":", 1)[1] for address_port in listening(launcher)})


def probe_the_launcher(engine, run: ComposeRun) -> dict[str, list[str]]:
    """A stranger's container on the project's network sends a pickle that runs code (and a GET of the ranks' keys)
    to every port the launcher container listens on (horovodrun's rendezvous among them); what each listening
    address:port answered.
    Nothing of the job listens on a wildcard address, and no pickle ran."""
    launcher = launcher_container(engine, run)
    local = listening(launcher)
    assert local and not [address for address in local if address.startswith(("0.0.0.0:", "*:", "[::]:"))], local
    address, ports = launcher_ports(engine, run)
    output = engine.containers.run(
        IMAGE,
        ["python", "/probe/rendezvous_probe.py", address, MARKER, *ports],
        network=f"{run.project}_default",
        remove=True,
        volumes={str(USER_SCRIPT): {"bind": "/probe", "mode": "ro"}},
    ).decode()
    assert launcher.exec_run(["test", "-d", "/tmp"]).exit_code == 0  # the check's control
    assert launcher.exec_run(["test", "-e", MARKER]).exit_code == 1, "a stranger's pickle ran in the launcher"
    where = {address_port.rsplit(":", 1)[1]: address_port for address_port in local}
    return {where[port]: got for port, got in json.loads(output.strip().splitlines()[-1]).items()}


def test_elastic_job_loses_a_worker_and_finishes_at_the_smaller_size(engine, compose_run, tmp_path, measured):
    """ELASTIC_MIN_WORKERS=2 of 3: `docker kill` one worker after epoch 1; training goes on with 2 and finishes.
    Before the kill, a stranger on the project's network probes every port of the launcher: its rendezvous refuses
    (403, and a line naming the sender), and nothing it sends runs."""
    run = compose_run(WORKERS="3", ELASTIC_MIN_WORKERS="2", EPOCHS="10")
    log = tmp_path / "compose.log"
    # Plain `up`: --exit-code-from would stop the whole project as soon as the killed worker exits.
    process = run.start("up", log=log)
    try:
        wait_for_line(log, "epoch 1/10:", process, timeout=400)
        answers = probe_the_launcher(engine, run)
        measured(f"rendezvous probe of the compose launcher's listening ports: {answers}")
        assert [port for port, got in answers.items() if got == ["403", "403", "403"]], answers
        assert not [port for port, got in answers.items() if "200" in got], answers
        victim = next(
            c
            for c in project_containers(engine, run.project)
            if c.labels["com.docker.compose.service"] == "worker" and horovod_rank(c) == 2
        )
        victim.kill()
        wait_for_line(log, "first step at world size 2", process, timeout=120)
        process.wait(timeout=400)
    finally:
        if process.poll() is None:
            process.kill()
    output = ANSI_ESCAPE.sub("", log.read_text())
    assert process.returncode == 0, output[-5000:]
    assert "world size 3 -> 2" in output and "job succeeded (exit status 0)" in output, output[-5000:]
    assert "horovod-stack: refused a rendezvous request from " in output, output[-5000:]
    found = re.search(r"first step at world size 2, ([0-9.]+) s after the last step", output)
    assert found, output[-5000:]
    gap = found.group(1)
    measured(f"elastic (compose): {gap} s from the last step at world size 3 to the first at world size 2")
    exit_codes = sorted(
        (c.labels["com.docker.compose.service"], c.attrs["State"]["ExitCode"])
        for c in project_containers(engine, run.project)
    )
    assert exit_codes == [("launcher", 0), ("worker", 0), ("worker", 0), ("worker", 137)], exit_codes

    epochs = [json.loads(line) for line in run.read_shared("runs/latest/metrics.jsonl").splitlines()]
    sizes = [epoch["world_size"] for epoch in epochs]
    assert [epoch["epoch"] for epoch in epochs] == list(range(1, 11)), epochs
    assert sizes[0] == 3 and sizes[-1] == 2 and sizes == sorted(sizes, reverse=True), sizes
    assert epochs[-1]["val_accuracy"] >= 0.90, epochs[-1]
    print(f"elastic (compose): world sizes {sizes}, final val accuracy {epochs[-1]['val_accuracy']:.4f}")
    summary = json.loads(run.read_shared("runs/latest/summary.json"))
    assert len({rank["digest"] for rank in summary["ranks"]}) == 1 and summary["world_size"] == 2
    assert project_containers(engine, run.project, status="running") == []


def test_killed_launcher_container_stops_every_worker_and_up_returns(engine, compose_run, tmp_path, measured):
    """`docker kill` of the job's driver mid-run: its ssh connections close, the workers stop, plain `up` returns."""
    run = compose_run(DATASET="synthetic", EPOCHS="200")
    log = tmp_path / "compose.log"
    process = run.start("up", log=log)
    try:
        wait_for_line(log, "epoch 1/200:", process, timeout=400)
        launcher = next(
            c for c in project_containers(engine, run.project) if c.labels["com.docker.compose.service"] == "launcher"
        )
        launcher.kill()
        killed = time.monotonic()
        process.wait(timeout=60)
        took = time.monotonic() - killed
    finally:
        if process.poll() is None:
            process.kill()
    output = ANSI_ESCAPE.sub("", log.read_text())
    left = [c.name for c in project_containers(engine, run.project, status="running")]
    measured(f"compose launcher killed: `up` returned {took:.1f} s later, running containers left: {left}")
    assert left == []
    said = lost_driver_message("compose's launcher container").removeprefix(LOST_PREFIX)  # as the entrypoint logs it
    assert output.count(f"{said}; stopping") == 2, output[-3000:]


def test_a_paused_worker_ends_the_job_within_a_minute_naming_it(engine, compose_run, tmp_path, measured):
    """`docker pause` stops a worker answering without a TCP reset, as a silent node does: the job ends, naming it."""
    run = compose_run(DATASET="synthetic", EPOCHS="200")
    log = tmp_path / "compose.log"
    process = run.start("up", log=log)
    victim = None
    try:
        wait_for_line(log, "epoch 1/200:", process, timeout=400)
        victim = next(
            c for c in project_containers(engine, run.project) if c.labels["com.docker.compose.service"] == "worker"
        )
        address = next(iter(victim.attrs["NetworkSettings"]["Networks"].values()))["IPAddress"]
        victim.pause()
        paused = time.monotonic()
        ended = wait_for_line(log, "job FAILED", process, timeout=120) - paused
        victim.unpause()  # the node comes back: its worker notices its agent's connection closed and stops
        process.wait(timeout=120)
    finally:
        if victim is not None and (victim.reload() or victim.status == "paused"):
            victim.unpause()
        if process.poll() is None:
            process.kill()
    output = ANSI_ESCAPE.sub("", log.read_text())
    left = [c.name for c in project_containers(engine, run.project, status="running")]
    measured(f"compose worker paused: job FAILED {ended:.1f} s later; running containers left: {left}")
    cause = f"{address} went silent (no answer for 15 s: link down, host down or powered off)"
    assert f"error: {cause}; ending the job" in output and "job FAILED (exit status" in output, output[-3000:]
    assert ended <= 60 and left == []


def test_elastic_minimum_above_the_worker_count_is_refused_in_one_line(engine, compose_run):
    run = compose_run(ELASTIC_MIN_WORKERS="3")
    result = run.compose("up")
    output = result.stdout + result.stderr
    assert "error: ELASTIC_MIN_WORKERS=3 is not from 1 to the 2 workers in WORKERS; fix it in .env" in output, output[
        -3000:
    ]
    assert "job FAILED (exit status 2)" in output
    assert project_containers(engine, run.project, status="running") == []


def test_image_carries_no_private_key(engine):
    image = engine.images.get(IMAGE)
    assert not any(PRIVATE_KEY_MARK.decode() in variable for variable in image.attrs["Config"]["Env"] or [])
    history = subprocess.run(
        ["docker", "history", "--no-trunc", IMAGE], capture_output=True, text=True, check=True
    ).stdout
    assert PRIVATE_KEY_MARK.decode() not in history

    # Every layer, not only the final file system: a key deleted in a later layer still ships in an earlier one.
    with subprocess.Popen(["docker", "save", IMAGE], stdout=subprocess.PIPE) as save:
        offenders = list(private_keys_in_image_archive(save.stdout))
    assert save.returncode == 0
    assert offenders == []


def test_layer_scan_finds_a_key_deleted_in_a_later_layer(engine, tmp_path):
    """The control for the scan above: it must see into every layer."""
    (tmp_path / "Dockerfile").write_text(
        "FROM horovod-stack-base:bookworm\n"
        "RUN printf -- '-----BEGIN OPENSSH PRIV''ATE KEY-----\\nnot-a-real-key\\n' > /root/id_test\n"
        "RUN rm /root/id_test\n"
    )
    tag = f"hst-keyscan-control:{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "build", "-q", "-t", tag, str(tmp_path)], check=True, capture_output=True)
    try:
        with subprocess.Popen(["docker", "save", tag], stdout=subprocess.PIPE) as save:
            offenders = list(private_keys_in_image_archive(save.stdout))
        assert len(offenders) == 1 and offenders[0].endswith("root/id_test")
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def private_keys_in_image_archive(stream):
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            if not member.isfile():
                continue
            layer = archive.extractfile(member)
            if member.name.endswith("layer.tar") or member.name.startswith("blobs/"):
                try:
                    with tarfile.open(fileobj=layer, mode="r|*") as files:
                        for entry in files:
                            if entry.isfile() and entry.size < 64 * 1024:
                                extracted = files.extractfile(entry)  # a regular file's: never None
                                if extracted and PRIVATE_KEY_MARK in extracted.read():
                                    yield f"{member.name}:{entry.name}"
                except tarfile.ReadError:
                    continue  # a JSON blob (config, manifest), not a layer


def test_gpu_image_has_nccl_mpi_and_gloo_ops(engine):
    output = engine.containers.run(IMAGE, ["horovodrun", "--check-build"], remove=True).decode()
    for line in ("[X] PyTorch", "[X] MPI", "[X] Gloo", "[X] NCCL"):
        assert line in output, output


def test_image_sees_no_gpu_unless_asked_and_requires_a_cuda_13_driver(engine):
    # On a host whose default runtime is nvidia, a CPU worker must not see every GPU (`void`: none unless a
    # device request names them), and the toolkit refuses a driver older than torch's CUDA 13.0 build needs.
    env = dict(item.split("=", 1) for item in engine.images.get(IMAGE).attrs["Config"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["NVIDIA_REQUIRE_CUDA"] == "cuda>=13.0"


@pytest.fixture
def lone_worker(engine, tmp_path):
    """One worker container as the stack starts it, on a network of its own, its authorized key "ours" (both halves
    in tmp_path, with a key "theirs" of another cluster): yields (network, worker's name, hostkeys volume)."""
    name = f"hst-sec-{uuid.uuid4().hex[:8]}"
    for cluster in ("ours", "theirs"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / cluster)], check=True)
        (tmp_path / cluster).chmod(0o644)  # a throwaway key, read by the probe as the image's user
    tmp_path.chmod(0o755)
    network = engine.networks.create(name)
    volumes = [engine.volumes.create(f"{name}-ssh"), engine.volumes.create(f"{name}-hostkeys")]
    try:
        engine.containers.run(
            IMAGE,
            ["sh", "-c", f"echo '{(tmp_path / 'ours.pub').read_text().strip()}' > /cluster/ssh/authorized_keys"],
            volumes={volumes[0].name: {"bind": "/cluster/ssh", "mode": "rw"}},
            remove=True,
        )
        worker = f"{name}-worker"
        engine.containers.run(
            IMAGE,
            ["worker"],
            name=worker,
            network=name,
            detach=True,
            volumes={
                volumes[0].name: {"bind": "/cluster/ssh", "mode": "ro"},
                volumes[1].name: {"bind": "/cluster/hostkeys", "mode": "rw"},
            },
        )
        yield name, worker, volumes[1].name
    finally:
        for container in engine.containers.list(all=True, filters={"name": name}):
            container.remove(force=True)
        network.remove()
        for volume in volumes:
            volume.remove(force=True)


def probe(engine, lone_worker, tmp_path, script: str, user: str = "mpiuser") -> str:
    """`bash -c script` in a container of the image beside the worker, once its host key is published and its
    sshd listens ($address: its address; the keys at /keys)."""
    network, worker, hostkeys = lone_worker
    wait = (
        f"address=$(getent hosts {worker} | cut -d' ' -f1); "
        "tries=0; until [ -f /cluster/hostkeys/$address.pub ] && (exec 3<>/dev/tcp/$address/12345) 2>/dev/null; "
        "do sleep 0.5; [ $((tries += 1)) -lt 120 ] || { echo 'the worker never answered'; exit 1; }; done; "
    )
    return engine.containers.run(
        IMAGE,
        ["bash", "-c", wait + script],
        user=user,
        network=network,
        remove=True,
        volumes={str(tmp_path): {"bind": "/keys", "mode": "ro"}, hostkeys: {"bind": "/cluster/hostkeys", "mode": "ro"}},
    ).decode()


def test_worker_refuses_passwords_and_other_clusters_keys_and_logs_the_attempts(engine, lone_worker, tmp_path):
    """A worker accepts its own cluster's key only: not a password, not another cluster's key; its log shows each
    login and each refused attempt."""
    _, worker, _ = lone_worker
    output = probe(
        engine,
        lone_worker,
        tmp_path,
        (
            # pin the worker's published host key, as the launcher does
            f"echo \"[{worker}]:12345 $(cut -d' ' -f1,2 /cluster/hostkeys/$address.pub)\" > /tmp/known_hosts; "
            "try() { ssh -p 12345 -o UserKnownHostsFile=/tmp/known_hosts -o StrictHostKeyChecking=yes "
            f'-o ConnectTimeout=5 "$@" mpiuser@{worker} echo logged-in 2>&1; echo "exit=$?"; }}; '
            "install -m 600 /keys/ours /keys/theirs /tmp/; "  # ssh takes no private key others may read
            "echo '--- ours'; try -o BatchMode=yes -i /tmp/ours; "
            "echo '--- theirs'; try -o BatchMode=yes -i /tmp/theirs; "
            "echo '--- password'; try -o PubkeyAuthentication=no -o "
            "PreferredAuthentications=password,keyboard-interactive "
            "-o NumberOfPasswordPrompts=1 < /dev/null"
        ),
        user="root",
    )
    ours, theirs, password = [part.strip() for part in output.split("--- ")[1:]]
    assert "logged-in" in ours and ours.endswith("exit=0"), output  # the control: our key works
    assert "Permission denied (publickey)" in theirs and "logged-in" not in theirs, output
    assert "Permission denied (publickey)" in password and "logged-in" not in password, output
    log = engine.containers.get(worker).logs().decode()
    assert "Accepted publickey for mpiuser" in log, log
    assert "Connection closed by authenticating user mpiuser" in log, log  # "theirs", refused


def test_both_ssh_paths_refuse_a_worker_whose_host_key_changed(engine, lone_worker, tmp_path):
    """mpirun's ssh (the fixed-size path, as the job agent's) and Horovod's own (elastic horovodrun's, patched in
    the image) both connect with the cluster's ssh config and its pinned known_hosts: a worker whose host key is not
    the pinned one is refused by both; with the right pin both log in, and the elastic path hands the environment
    over the ssh channel's stdin (env_channel, as the patched gloo_run wraps it), not its command line."""
    _, worker, _ = lone_worker
    (tmp_path / "both_paths.py").write_text(f"""
import json, os, shlex, subprocess
from pathlib import Path
from horovod.runner.common.util import env_channel
from horovod.runner.util.remote import get_remote_command
from launcher.core.jobspec import ssh_config
from launcher.core.protocol import CLUSTER_KEY, KNOWN_HOSTS, SSH_CONFIG

address = os.environ["address"]
Path(SSH_CONFIG).parent.mkdir(mode=0o700, exist_ok=True)
Path(SSH_CONFIG).write_text(ssh_config(12345))
Path(CLUSTER_KEY).write_bytes(Path("/keys/ours").read_bytes())
Path(CLUSTER_KEY).chmod(0o600)
pinned = " ".join(Path(f"/cluster/hostkeys/{{address}}.pub").read_text().split()[:2])
impostor = " ".join(Path("/keys/theirs.pub").read_text().split()[:2])
os.environ["API_KEY"] = "sk-SENT-OVER-SSH"
found = {{}}
for label, key in (("changed", impostor), ("pinned", pinned)):
    Path(KNOWN_HOSTS).write_text(f"[{worker}]:12345 {{key}}\\n")
    fixed = subprocess.run(["ssh", "{worker}", "echo logged-in"], capture_output=True, text=True)
    remote = shlex.quote(env_channel.receiving("echo logged-in API_KEY=$API_KEY"))
    elastic_line = env_channel.sending(get_remote_command(remote, "{worker}", port=12345))
    elastic = subprocess.run(elastic_line, shell=True, capture_output=True, text=True)
    found[label] = {{"fixed": [fixed.returncode, fixed.stdout + fixed.stderr],
                    "elastic": [elastic.returncode, elastic.stdout + elastic.stderr], "elastic_line": elastic_line}}
print(json.dumps(found))
""")
    output = probe(engine, lone_worker, tmp_path, "export address; python /keys/both_paths.py")
    found = json.loads(output.strip().splitlines()[-1])
    print(
        "\nhost key changed: "
        + "; ".join(
            f"{path} path exit {found['changed'][path][0]}: {found['changed'][path][1].strip().splitlines()[-1]}"
            for path in ("fixed", "elastic")
        )
    )
    for path in ("fixed", "elastic"):
        status, said = found["changed"][path]
        assert status == 255 and "Host key verification failed" in said and "logged-in" not in said, found
        status, said = found["pinned"][path]
        assert status == 0 and "logged-in" in said, found
    assert "API_KEY=sk-SENT-OVER-SSH" in found["pinned"]["elastic"][1], found
    assert (
        "sk-SENT-OVER-SSH" not in found["pinned"]["elastic_line"]
        and "StrictHostKeyChecking" not in found["pinned"]["elastic_line"]
        and "SendEnv" not in found["pinned"]["elastic_line"]
    ), found


def test_gpu_variant_gives_one_worker_every_gpu_and_a_rank_per_gpu(compose_run):
    """Docker turns `count: N` into GPUs 0..N-1 in every container: two workers would share GPU 0."""
    run = compose_run(GPUS="4")
    result = run.compose("-f", "compose.yaml", "-f", "compose.gpu.yaml", "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    worker, launcher = services["worker"], services["launcher"]
    assert worker["deploy"]["replicas"] == 1
    [device] = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["count"] == 4 and device["capabilities"] == ["gpu"]
    assert worker["ulimits"]["memlock"] == -1 and worker["ulimits"]["stack"] == 64 * 1024**2
    assert launcher["environment"]["WORKERS"] == "1" and launcher["environment"]["GPUS"] == "4"
    assert launcher["environment"]["SLOTS_PER_WORKER"] == ""  # the GPUs imply the slots (launcher/core/ranks.py)
    assert launcher["environment"]["HOROVOD_STACK_GPUS"] == "1"
