"""Horovod jobs on a real Slurm cluster of this machine (tests/slurmcluster.py), in the stack's image as a SIF run by
Apptainer, each job's batch script written by `launcher export sbatch` and submitted with `sbatch` by an
unprivileged user: the bundled trainer on 2 nodes x 1 and 2 nodes x 2 ranks, PyTorch's and TensorFlow's; a user's own
script from --workdir with a secret given by name; a failing rank fails the job naming its node and task; `scancel`
leaves no process behind; a job that stalls under --stall-timeout prints every rank's stack and, under --stall-action
fail, ends FAILED; a node lost mid-run under --max-restarts: Slurm requeues the job, which resumes from its checkpoint
once the node is back, and a requeue past --max-restarts stops in one line. Each job's end is read as its user reads
it, from the cluster's accounting database (`sacct`).

How the ranks start (each tried here, in this order): Debian's Slurm has no PMIx plugin (`srun --mpi=list`: none,
cray_shasta, pmi2), so `srun --mpi=pmix` is refused; the image's Open MPI (Debian 12's 4.1.4, external PMIx) has
no PMI-2 client, so under `srun --mpi=pmi2` each task initialises as a world of its own (size 1); `mpirun` inside the
container cannot start ranks on the other node (its Slurm launcher calls srun, which the container lacks, and its
ssh launcher needs an sshd the nodes do not run). What works, and what the exporter writes (launcher/slurm/sbatch.py
rank_start): srun starts one task per rank, each runs the SIF with Horovod's Gloo controller, and the ranks meet at
Horovod's rendezvous server, started by the batch script on the first node with a secret of the run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.slurmcluster import CONTROLLER, NODES, REPO, SHARED, UID, JobResult, SlurmCluster, node_image

pytestmark = pytest.mark.integration

EPOCHS = 5
"""The fewest epochs of `--dataset digits` that reach val accuracy 0.95 on 2 and on 4 ranks with the defaults."""
JOB_TIMEOUT = 900.0

SECRET = "TRACKER_API_KEY"
"""The secret setting the user's job asks for by name (`--secret`), its value exported where sbatch runs."""


def exported(cluster: SlurmCluster, name: str, sif: Path, *flags: str, command: tuple[str, ...]) -> str:
    """The batch script `launcher export sbatch` writes for a job on every node, with the paths as the nodes see
    them: the SIF under SHARED/images, the shared folder, the job's name; `flags` (--slots, --workdir, --secret) and
    `command` (the words after `--`) as a user gives them."""
    script = cluster.folder / f"{name}.sbatch"
    argv = [sys.executable, "-m", "launcher", "export", "sbatch", "--nodes", str(len(NODES)), "--sif", on_nodes(sif)]
    argv += ["--shared", SHARED, "--name", name, "--time", "20", *flags, "-o", str(script), "--", *command]
    # In the cluster's folder: no .env of this checkout's is read.
    done = subprocess.run(
        argv,
        cwd=cluster.folder,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"launcher export sbatch failed:\n{done.stderr}"
    return script.read_text()


def submitted(cluster: SlurmCluster, name: str, sif: Path, *flags: str, command: tuple[str, ...]) -> str:
    """The exported script of the job, submitted by the cluster's user with sbatch; its job ID."""
    return cluster.submit(exported(cluster, name, sif, *flags, command=command), name)


def built_sif(*which: str) -> Path:
    """scripts/build-sif.sh's SIF of the PyTorch image, or of TensorFlow's (`tensorflow`): made once per image."""
    made = subprocess.run(
        [REPO / "scripts" / "build-sif.sh", *which], capture_output=True, text=True, timeout=1800, env=os.environ
    )
    assert made.returncode == 0, f"building the SIF failed:\n{made.stderr[-3000:]}"
    return Path(made.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pytorch_sif() -> Path:
    return built_sif()


@pytest.fixture(scope="module")
def cluster(pytorch_sif: Path) -> Iterator[SlurmCluster]:
    with SlurmCluster(node_image(), images=pytorch_sif.parent.parent) as started:
        yield started


def on_nodes(sif: Path) -> str:
    """A SIF's path on the nodes: the cache's folder is SHARED/images there."""
    return f"{SHARED}/images/{sif.parent.name}/{sif.name}"


def trained(cluster: SlurmCluster, sif: Path, name: str, tasks_per_node: int, measured, epochs: int = EPOCHS) -> dict:
    """Submits the bundled trainer on every node with tasks_per_node ranks each; its rank -> node once it ended."""
    command = ("--dataset", "digits", "--epochs", str(epochs), "--progress", "lines")
    job = submitted(cluster, name, sif, "--slots", str(tasks_per_node), command=command)
    result = cluster.wait(job, JOB_TIMEOUT)
    measured(f"slurm job {name}: {result.state} {result.exit_code} in {result.seconds:.0f} s on {result.nodes}")
    return finished_training(cluster, result, name, len(NODES) * tasks_per_node, epochs)


def sacct_shows(cluster: SlurmCluster, job: str) -> list[str]:
    """The words of docs/slurm.md's `sacct -j JOB -X -n -o State,ExitCode`, run by the user on the login node."""
    return cluster.exec(CONTROLLER, f"sacct -j {job} -X -n -o State,ExitCode").stdout.split()


def finished_training(cluster: SlurmCluster, result: JobResult, name: str, ranks: int, epochs: int) -> dict:
    """The trainer's job ended COMPLETED 0:0 (sacct) with every epoch recorded once, val accuracy >= 0.95 and the same
    parameters on every rank, its curves drawn in the run folder; its rank -> node."""
    print(result.output[-2500:])
    assert (result.state, result.exit_code) == ("COMPLETED", "0:0"), f"{result}\n{cluster.logs()}"
    assert sacct_shows(cluster, result.job_id) == ["COMPLETED", "0:0"]
    assert f"parameters identical on all {ranks} ranks" in result.output, result.output[-3000:]
    local_run = cluster.shared / "runs" / f"{name}-{result.job_id}"
    assert f"run folder: {SHARED}/runs/{name}-{result.job_id}" in result.output, result.output[:2000]
    records = [json.loads(line) for line in (local_run / "metrics.jsonl").read_text().splitlines()]
    assert [record["epoch"] for record in records] == list(range(1, epochs + 1))
    assert records[-1]["world_size"] == ranks and records[-1]["val_accuracy"] >= 0.95, records[-1]
    summary = json.loads((local_run / "summary.json").read_text())
    assert len({entry["digest"] for entry in summary["ranks"]}) == 1, summary["ranks"]
    assert (local_run / "curves.png").read_bytes().startswith(b"\x89PNG"), "no training curves in the run folder"
    return {entry["rank"]: entry["host"] for entry in summary["ranks"]}


def test_two_nodes_one_rank_each(cluster, pytorch_sif, measured):
    measured(f"slurm cluster: up in {cluster.start_seconds:.1f} s")
    assert trained(cluster, pytorch_sif, "pytorch-2x1", 1, measured) == {0: "node1", 1: "node2"}


def test_two_nodes_two_ranks_each(cluster, pytorch_sif, measured):
    ranks = trained(cluster, pytorch_sif, "pytorch-2x2", 2, measured)
    assert ranks == {0: "node1", 1: "node1", 2: "node2", 3: "node2"}


TENSORFLOW_EPOCHS = {1: EPOCHS, 2: 10}
"""Epochs of digits for TensorFlow's trainer by ranks per node: Keras's model reaches val accuracy 0.95 later on 4
ranks (0.90 after 5 epochs, 0.97 after 8 to 10, as measured here)."""


@pytest.mark.parametrize("tasks_per_node", [1, 2], ids=["2x1", "2x2"])
def test_tensorflow_on_two_nodes(cluster, measured, tasks_per_node):
    """TensorFlow's image: the same job script, its SIF, its trainer (`python -m app.train` runs Keras there)."""
    started = time.monotonic()
    sif = built_sif("tensorflow")
    measured(f"tensorflow SIF: ready in {time.monotonic() - started:.0f} s, {sif.stat().st_size / 1e9:.2f} GB")
    name, epochs = f"tensorflow-2x{tasks_per_node}", TENSORFLOW_EPOCHS[tasks_per_node]
    ranks = trained(cluster, sif, name, tasks_per_node, measured, epochs)
    assert ranks == {rank: NODES[rank // tasks_per_node] for rank in range(len(NODES) * tasks_per_node)}


def test_a_failing_rank_fails_the_job_naming_its_node_and_task(cluster, pytorch_sif):
    rank_1_fails = ("python", "-c", 'import os, sys; sys.exit(3 if os.environ["HOROVOD_RANK"] == "1" else 0)')
    job = submitted(cluster, "fails", pytorch_sif, command=rank_1_fails)
    result = cluster.wait(job, 120)
    # srun's status is the failed rank's, or 143 where it had to end rank 0 (still starting) with SIGTERM first.
    assert result.state == "FAILED" and result.exit_code in ("3:0", "143:0"), result
    assert sacct_shows(cluster, job) == ["FAILED", result.exit_code]
    assert "node2: task 1: Exited with exit code 3" in result.output, result.output


def processes(cluster: SlurmCluster, host: str) -> list[str]:
    """The names of the processes of the submitting user on one node (the node image has no ps)."""
    listed = cluster.exec(host, f"grep -l '^Uid:.*\\b{UID}\\b' /proc/[0-9]*/status | xargs -r cat 2>/dev/null "
                          "| sed -n 's/^Name:\\t//p'", user="root", check=False)  # fmt: skip
    return [name for name in listed.stdout.split() if name not in ("grep", "xargs", "cat", "sed")]


def test_scancel_ends_every_rank_and_leaves_no_process_on_any_node(cluster, pytorch_sif):
    job = submitted(cluster, "cancelled", pytorch_sif, command=("--dataset", "synthetic", "--epochs", "500"))
    deadline = time.monotonic() + 120
    while not all("python" in processes(cluster, host) for host in NODES) and time.monotonic() < deadline:
        time.sleep(1)
    assert all("python" in processes(cluster, host) for host in NODES), "the ranks never started"
    cluster.exec(CONTROLLER, f"scancel {job}")
    assert cluster.wait(job, 60).state == "CANCELLED"
    assert sacct_shows(cluster, job)[0] == "CANCELLED+"  # "CANCELLED by 1000", cut to the column's width
    deadline = time.monotonic() + 30
    while any(processes(cluster, host) for host in NODES) and time.monotonic() < deadline:
        time.sleep(1)
    assert {host: processes(cluster, host) for host in NODES} == {host: [] for host in NODES}


def test_a_users_script_from_workdir_runs_on_both_nodes_with_a_secret_not_in_the_script(cluster, pytorch_sif):
    """The user's own Horovod script (tests/user_script/, copied where every node reads it: --workdir), run by a
    shell line that first prints a digest of the secret each rank got (`--secret NAME`: the value exported in the
    shell that runs sbatch, not in the script)."""
    workdir = cluster.shared / "user_script"
    shutil.copytree(REPO / "tests" / "user_script", workdir, ignore=shutil.ignore_patterns("__pycache__"))
    value = secrets.token_hex(16)
    line = f'echo "secret sha256 $(printf %s "${SECRET}" | sha256sum | cut -d" " -f1)"; exec python allreduce_train.py'
    flags = ("--workdir", f"{SHARED}/user_script", "--secret", SECRET)
    script = exported(cluster, "user-script", pytorch_sif, *flags, command=("sh", "-c", f"{line} --steps 5"))
    assert value not in script and SECRET in script
    job = cluster.submit(script, "user-script", env={SECRET: value})
    result = cluster.wait(job, 300)
    print(result.output[-2500:])
    assert (result.state, result.exit_code) == ("COMPLETED", "0:0"), f"{result}\n{cluster.logs()}"
    digest = hashlib.sha256(value.encode()).hexdigest()
    for rank, node in enumerate(NODES):
        assert f"{rank}: secret sha256 {digest}" in result.output, result.output[-3000:]
        ran = f"{rank}: user-script rank {rank} of 2 on {node} (2 hosts, 1 rank(s) on this one): allreduce sum 3 ok"
        assert ran in result.output, result.output[-3000:]
    assert value not in result.output


HANGS = """import time

import horovod.torch as hvd
import torch


def wait_forever():
    while True:
        time.sleep(1)


hvd.init()
print(f"rank {hvd.rank()} started", flush=True)
if hvd.rank() == 1:
    wait_forever()
hvd.allreduce(torch.ones(1), name="never_joined")
"""
"""A user's script that hangs: rank 1 never reaches the allreduce rank 0 waits in."""


def test_a_stalled_job_prints_every_ranks_stack_and_fails_under_stall_action_fail(cluster, pytorch_sif, measured):
    """--stall-timeout 20 --stall-action fail: 20 s after the ranks' last line, every rank's stack (py-spy in the SIF,
    as the submitting user, beside the ranks) is in the job's output, rank 1 named as the odd one out, in the user's
    function; then the job ends FAILED, naming the stall."""
    workdir = cluster.shared / "stall_script"
    workdir.mkdir()
    (workdir / "hang.py").write_text(HANGS)
    flags = ("--workdir", f"{SHARED}/stall_script", "--stall-timeout", "20", "--stall-action", "fail")
    job = submitted(cluster, "stalled", pytorch_sif, *flags, command=("python", "hang.py"))
    result = cluster.wait(job, 300)
    print(result.output[-4000:])
    measured(f"slurm job stalled (stall timeout 20 s): {result.state} {result.exit_code} in {result.seconds:.0f} s")
    assert result.state == "FAILED", f"{result}\n{cluster.logs()}"
    output = result.output
    assert "the job looks stalled: no output and no new metrics for 2" in output, output[-4000:]
    assert re.search(r"^rank 1 \(node2 pid \d+\) in wait_forever at hang.py:9$", output, re.M), output[-4000:]
    assert re.search(r"^    wait_forever \(/workdir/hang.py:9\)$", output, re.M), output[-4000:]
    waiting = r"^rank 0 \(node1 pid \d+\) in \w+ at mpi_ops.py:\d+, from <module> at hang.py:16$"
    assert re.search(waiting, output, re.M), output[-4000:]
    ended = r"^error: the job stalled: no output and no new metrics for 2\d s; rank 1 \(node2 pid \d+\) in wait_forever"
    assert re.search(ended + r" at hang.py:9 while rank 0 in .*; ending the job \(stall action fail\)$", output, re.M)


REQUEUE_EPOCHS = 12
"""Epochs of the job that loses a node: a fraction of a second each, so the run goes on for seconds after its first
checkpoint, while its node is lost."""
RESUMED = re.compile(r"resuming from \S+/checkpoints/latest\.pt after epoch (\d+)")
"""The trainer's line when it goes on from a checkpoint."""


def until(cluster: SlurmCluster, what: str, done: Callable[[], bool], timeout: float = 120) -> float:
    """Polls `done` until it holds; when it did (time.monotonic()), or an error naming `what` with Slurm's logs."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not after {timeout:.0f} s: {what}\n{cluster.logs()}")
        time.sleep(0.1)
    return time.monotonic()


def node_state(cluster: SlurmCluster, host: str) -> str:
    """sinfo's state of one node (`down*`: DOWN and not answering)."""
    return cluster.exec(CONTROLLER, f"sinfo -h -n {host} -o %t", check=False).stdout.strip()


def test_a_job_that_loses_a_node_is_requeued_and_resumes_from_its_checkpoint(cluster, pytorch_sif, measured):
    """--max-restarts 1: node2 dies mid-run, after the first checkpoint (its container killed: every process at once,
    no TCP reset), Slurm declares it DOWN and requeues the job; node2 is started again and returns to service; the
    job's second run, on both nodes, resumes after its newest checkpoint and completes. A requeue past
    --max-restarts stops in one line. Last in the module: a node lost for good would fail the tests after it."""
    name, lost = "requeued", NODES[-1]
    command = ("--dataset", "digits", "--epochs", str(REQUEUE_EPOCHS), "--progress", "lines")
    job = submitted(cluster, name, pytorch_sif, "--max-restarts", "1", command=command)
    checkpoints, output = (
        cluster.shared / "runs" / f"{name}-{job}" / "checkpoints",
        cluster.output_file(name, job),
    )
    until(cluster, "the job's first checkpoint", lambda: (checkpoints / "latest.pt").exists())
    address = cluster.address(lost)
    cluster.lose(lost)
    killed = time.monotonic()
    down = until(cluster, f"Slurm declares {lost} DOWN", lambda: node_state(cluster, lost).startswith("down"))
    requeued = until(cluster, "Slurm requeues the job", lambda: cluster.job(job).get("Restarts") == "1")
    cluster.bring_back(lost, address)
    back = time.monotonic()
    running = until(cluster, "the job runs again", lambda: cluster.job(job).get("JobState") == "RUNNING")
    resumed = until(cluster, "the trainer resumes", lambda: bool(RESUMED.search(output.read_text(errors="replace"))))
    result = cluster.wait(job, JOB_TIMEOUT)
    measured(
        f"slurm: {lost} lost mid-run: DOWN {down - killed:.1f} s later, the job requeued {requeued - killed:.1f} s "
        f"later; {lost} back {back - killed:.1f} s after its loss, the job running {running - back:.1f} s after that, "
        f"the trainer resumed {resumed - running:.1f} s into the run; {result.state} {result.exit_code} "
        f"{time.monotonic() - killed:.0f} s after the loss"
    )
    assert finished_training(cluster, result, name, len(NODES), REQUEUE_EPOCHS) == {0: "node1", 1: "node2"}
    assert result.output.count("restart 1/1: resuming from the newest checkpoint") == 1, result.output[-3000:]
    [epoch] = RESUMED.findall(result.output)
    assert 1 <= int(epoch) < REQUEUE_EPOCHS, result.output[-3000:]
    assert cluster.job(job)["Restarts"] == "1"

    cluster.exec(CONTROLLER, f"scontrol requeue {job}")  # a second requeue, past --max-restarts 1
    past = cluster.wait(job, 120)
    assert (past.state, past.exit_code, cluster.job(job)["Restarts"]) == ("FAILED", "1:0", "2"), past
    appended = past.output[len(result.output) :]
    assert "error: Slurm requeued the job 2 times, past --max-restarts 1: not run again" in appended.splitlines()
    assert "run folder" not in appended, appended
