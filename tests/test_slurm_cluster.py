"""Horovod jobs on a real Slurm cluster of this machine (tests/slurmcluster.py), in the stack's image as a SIF run by
Apptainer, submitted with `sbatch` by an unprivileged user: the bundled trainer on 2 nodes x 1 and 2 nodes x 2
ranks, and TensorFlow's on 2 x 1; a failing rank fails the job naming its node and task; `scancel` leaves no
process behind.

How the ranks start (each tried here, in this order): Debian's Slurm has no PMIx plugin (`srun --mpi=list`: none,
cray_shasta, pmi2), so `srun --mpi=pmix` is refused; the image's Open MPI (Debian 12's 4.1.4, external PMIx) has
no PMI-2 client, so under `srun --mpi=pmi2` each task initialises as a world of its own (size 1); `mpirun` inside the
container cannot start ranks on the other node (its Slurm launcher calls srun, which the container lacks, and its
ssh launcher needs an sshd the nodes do not run). What works: srun starts one task per rank, each runs the SIF
with Horovod's Gloo controller, and the ranks meet at Horovod's rendezvous server, started by the batch script on
the first node with the job's secret (GLOO_JOB below). The sbatch exporter writes the same lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurmcluster import CONTROLLER, NODES, REPO, SHARED, UID, SlurmCluster, node_image

pytestmark = pytest.mark.integration

EPOCHS = 5
"""The fewest epochs of `--dataset digits` that reach val accuracy 0.95 on 2 and on 4 ranks with the defaults."""
JOB_TIMEOUT = 900.0

GLOO_JOB = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={tasks_per_node}
#SBATCH --time=00:20:00
set -euo pipefail
sif={sif}
run={run}
mkdir -p "$run"
# The job's rendezvous secret: in the environment alone, never on a command line. Apptainer's --cleanenv passes on
# only the APPTAINERENV_ variables, without their prefix.
export HOROVOD_STACK_RENDEZVOUS_TOKEN=$(head -c 32 /dev/urandom | base64 | tr -d '/+=\\n')
export APPTAINERENV_HOROVOD_STACK_RENDEZVOUS_TOKEN=$HOROVOD_STACK_RENDEZVOUS_TOKEN
# Horovod's rendezvous server on this node, the allocation's first, for the ranks' Gloo to meet at.
address=$(getent hosts "$(hostname)" | awk '{{print $1; exit}}')
export APPTAINERENV_RENDEZVOUS_ADDRESS=$address
export APPTAINERENV_RENDEZVOUS_HOSTS=$(scontrol show hostnames "$SLURM_JOB_NODELIST" |
  sed "s/$/:$SLURM_NTASKS_PER_NODE/" | paste -sd,)
export APPTAINERENV_RENDEZVOUS_RANKS=$SLURM_NTASKS
apptainer -q exec --cleanenv "$sif" python -u -c '
import os, time
from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.http.http_server import RendezvousServer
server = RendezvousServer()
port = server.start(address=os.environ["RENDEZVOUS_ADDRESS"])
hosts = parse_hosts(os.environ["RENDEZVOUS_HOSTS"])
server.init(get_host_assignments(hosts, int(os.environ["RENDEZVOUS_RANKS"])))
print(port, flush=True)
while True:
    time.sleep(3600)
' > "$run/rendezvous.port" &
rendezvous=$!
trap 'kill $rendezvous 2>/dev/null || true' EXIT
for _ in $(seq 120); do [ -s "$run/rendezvous.port" ] && break; sleep 0.5; done
[ -s "$run/rendezvous.port" ] || {{ echo "the rendezvous server did not start on $(hostname)" >&2; exit 1; }}
export APPTAINERENV_HOROVOD_GLOO_RENDEZVOUS_ADDR=$address
export APPTAINERENV_HOROVOD_GLOO_RENDEZVOUS_PORT=$(cat "$run/rendezvous.port")
export APPTAINERENV_HOROVOD_CONTROLLER=gloo APPTAINERENV_HOROVOD_CPU_OPERATIONS=gloo
export APPTAINERENV_HOROVOD_GLOO_IFACE={iface}
# One task per rank; each maps Slurm's numbering onto Horovod's (block distribution: a node's ranks are adjacent).
srun --kill-on-bad-exit=1 bash -c '
export APPTAINERENV_HOROVOD_RANK=$SLURM_PROCID APPTAINERENV_HOROVOD_SIZE=$SLURM_NTASKS
export APPTAINERENV_HOROVOD_LOCAL_RANK=$SLURM_LOCALID APPTAINERENV_HOROVOD_LOCAL_SIZE=$SLURM_NTASKS_PER_NODE
export APPTAINERENV_HOROVOD_CROSS_RANK=$SLURM_NODEID APPTAINERENV_HOROVOD_CROSS_SIZE=$SLURM_NNODES
export APPTAINERENV_HOROVOD_HOSTNAME=$SLURMD_NODENAME
exec apptainer -q exec --cleanenv --bind {shared} "$0" "$@"' "$sif" {command}
"""
"""A job of the bundled trainer's ranks over Gloo: {name}, {nodes}, {tasks_per_node}, {sif} and {run} (paths on
the nodes), {iface} (the nodes' NIC the ranks talk over) and {command} (the rank's command, in the SIF)."""


def gloo_job(name: str, sif: str, nodes: int, tasks_per_node: int, command: str) -> str:
    return GLOO_JOB.format(
        name=name,
        nodes=nodes,
        tasks_per_node=tasks_per_node,
        sif=sif,
        run=f"{SHARED}/runs/{name}",
        iface="eth0",
        shared=SHARED,
        command=command,
    )


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


def trained(cluster: SlurmCluster, sif: Path, name: str, tasks_per_node: int, measured) -> dict:
    """Submits the trainer on every node with tasks_per_node ranks each; returns its summary once it finished."""
    run = f"{SHARED}/runs/{name}"
    command = f"python -m app.train --dataset digits --epochs {EPOCHS} --run-dir {run} --progress lines"
    job = cluster.submit(gloo_job(name, on_nodes(sif), len(NODES), tasks_per_node, command), name)
    result = cluster.wait(job, JOB_TIMEOUT)
    measured(f"slurm job {name}: {result.state} {result.exit_code} in {result.seconds:.0f} s on {result.nodes}")
    print(result.output[-2500:])
    assert (result.state, result.exit_code) == ("COMPLETED", "0:0"), f"{result}\n{cluster.logs()}"
    ranks = len(NODES) * tasks_per_node
    assert f"parameters identical on all {ranks} ranks" in result.output, result.output[-3000:]
    local_run = cluster.shared / "runs" / name
    epochs = [json.loads(line) for line in (local_run / "metrics.jsonl").read_text().splitlines()]
    assert [epoch["epoch"] for epoch in epochs] == list(range(1, EPOCHS + 1))
    assert epochs[-1]["world_size"] == ranks and epochs[-1]["val_accuracy"] >= 0.95, epochs[-1]
    summary = json.loads((local_run / "summary.json").read_text())
    assert len({entry["digest"] for entry in summary["ranks"]}) == 1, summary["ranks"]
    return {entry["rank"]: entry["host"] for entry in summary["ranks"]}


def test_two_nodes_one_rank_each(cluster, pytorch_sif, measured):
    measured(f"slurm cluster: up in {cluster.start_seconds:.1f} s")
    assert trained(cluster, pytorch_sif, "pytorch-2x1", 1, measured) == {0: "node1", 1: "node2"}


def test_two_nodes_two_ranks_each(cluster, pytorch_sif, measured):
    ranks = trained(cluster, pytorch_sif, "pytorch-2x2", 2, measured)
    assert ranks == {0: "node1", 1: "node1", 2: "node2", 3: "node2"}


def test_tensorflow_on_two_nodes_one_rank_each(cluster, measured):
    """TensorFlow's image: the same job script, its SIF, its trainer (`python -m app.train` runs Keras there)."""
    started = time.monotonic()
    sif = built_sif("tensorflow")
    measured(f"tensorflow SIF: ready in {time.monotonic() - started:.0f} s, {sif.stat().st_size / 1e9:.2f} GB")
    assert trained(cluster, sif, "tensorflow-2x1", 1, measured) == {0: "node1", 1: "node2"}


def test_a_failing_rank_fails_the_job_naming_its_node_and_task(cluster, pytorch_sif):
    rank_1_fails = 'python -c \'import os, sys; sys.exit(3 if os.environ["HOROVOD_RANK"] == "1" else 0)\''
    job = cluster.submit(gloo_job("fails", on_nodes(pytorch_sif), len(NODES), 1, rank_1_fails), "fails")
    result = cluster.wait(job, 120)
    # srun's status is the failed rank's, or 143 where it had to end rank 0 (still starting) with SIGTERM first.
    assert result.state == "FAILED" and result.exit_code in ("3:0", "143:0"), result
    assert "node2: task 1: Exited with exit code 3" in result.output, result.output


def processes(cluster: SlurmCluster, host: str) -> list[str]:
    """The names of the processes of the submitting user on one node (the node image has no ps)."""
    listed = cluster.exec(host, f"grep -l '^Uid:.*\\b{UID}\\b' /proc/[0-9]*/status | xargs -r cat 2>/dev/null "
                          "| sed -n 's/^Name:\\t//p'", user="root", check=False)  # fmt: skip
    return [name for name in listed.stdout.split() if name not in ("grep", "xargs", "cat", "sed")]


def test_scancel_ends_every_rank_and_leaves_no_process_on_any_node(cluster, pytorch_sif):
    command = f"python -m app.train --dataset synthetic --epochs 500 --run-dir {SHARED}/runs/cancelled"
    job = cluster.submit(gloo_job("cancelled", on_nodes(pytorch_sif), len(NODES), 1, command), "cancelled")
    deadline = time.monotonic() + 120
    while not all("python" in processes(cluster, host) for host in NODES) and time.monotonic() < deadline:
        time.sleep(1)
    assert all("python" in processes(cluster, host) for host in NODES), "the ranks never started"
    cluster.exec(CONTROLLER, f"scancel {job}")
    assert cluster.wait(job, 60).state == "CANCELLED"
    deadline = time.monotonic() + 30
    while any(processes(cluster, host) for host in NODES) and time.monotonic() < deadline:
        time.sleep(1)
    assert {host: processes(cluster, host) for host in NODES} == {host: [] for host in NODES}
