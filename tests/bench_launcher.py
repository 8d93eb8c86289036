"""Launcher figures on the two-host harness (tests/multihost.py), printed, not asserted:

    .venv/bin/python -m tests.bench_launcher
    .venv/bin/python -m tests.bench_launcher --soak 20
    .venv/bin/python -m tests.bench_launcher --push
    .venv/bin/python -m tests.bench_launcher --lost-node

- time from `launcher start` to the first training step: cold (the image pushed to node_2) and warm;
- how a worker killed mid-run, Ctrl-C and a taken SSH port end: exit status, seconds after the event,
  the error line, the cleanup line, and what is left on each node;
- --push: the cold launch (`--push-image` to nodes that start empty, to the first training step and to the end)
  for 1 node and for 3 nodes, side by side in one run: one export streams to every node at once, so 3 nodes should
  cost about what 1 does;
- --lost-node: a node lost mid-run (its worker killed after epoch 2 of 12), two ways side by side in one run: the
  job's agent restarting it on a warm spare (--max-restarts 1 --spares node_3), and the manual way (the job fails,
  then the same start again on node_1,node_3 with --resume, at once, as if someone were watching): the seconds from
  the loss to the first training step after it;
- --soak N: N cycles of an attached start ended by Ctrl-C, then a detached start and `launcher stop`; what
  the launcher left on the nodes afterwards (containers, networks, volumes) and the wall time.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.multihost import Cluster

LAUNCHER = str(Path(sys.executable).parent / "launcher")
IMAGE = "horovod-stack:latest"


def start(cluster: Cluster, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [LAUNCHER, "start", "--env-file", str(cluster.env_file()), *args],
        env=cluster.launcher_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def time_to_first_step(cluster: Cluster, label: str, *flags: str) -> None:
    started = time.monotonic()
    process = start(cluster, *flags, "--", "--dataset", "digits", "--epochs", "3")
    assert process.stdout is not None and process.stderr is not None
    first_step = next((time.monotonic() - started for line in process.stdout if "epoch 1 [" in line), None)
    process.wait()
    pushed = [line for line in process.stderr.read().splitlines() if "image loaded" in line]
    print(
        f"{label}: first training step after {first_step:.1f} s, exit {process.returncode} after "
        f"{time.monotonic() - started:.1f} s {' '.join(pushed)}",
        flush=True,
    )


def failure(cluster: Cluster, label: str, event) -> None:
    process = start(cluster, "--", "--dataset", "synthetic", "--epochs", "200")
    assert process.stdout is not None
    for line in process.stdout:
        if "epoch 1/200" in line:
            break
    happened = time.monotonic()
    event(process)
    _, stderr = process.communicate()
    lines = [line for line in stderr.splitlines() if "cleanup" in line or line.startswith("error")]
    print(
        f"{label}: exit {process.returncode} {time.monotonic() - happened:.1f} s after the event; {lines}; "
        f"left: {cluster.project_containers()}",
        flush=True,
    )


def leftovers(cluster: Cluster) -> dict[str, int]:
    """What the stack left on the nodes: its containers, networks beyond Docker's own, volumes beyond /shared's."""
    counts = {"containers": 0, "networks": 0, "volumes": 0}
    for node in cluster.nodes:
        client = node.client()
        counts["containers"] += len(client.containers.list(all=True, filters={"label": "horovod-stack.cluster"}))
        counts["networks"] += len([n for n in client.networks.list() if n.name not in ("bridge", "host", "none")])
        counts["volumes"] += len([v for v in client.volumes.list() if v.name != "horovod-stack-shared"])
    return counts


def soak(cluster: Cluster, cycles: int) -> None:
    started = time.monotonic()
    for cycle in range(1, cycles + 1):
        failure(cluster, f"cycle {cycle}: Ctrl-C", lambda process: process.send_signal(signal.SIGINT))
        detached = subprocess.run(
            [
                LAUNCHER,
                "start",
                "--env-file",
                str(cluster.env_file()),
                "--detach",
                "--",
                "--dataset",
                "synthetic",
                "--epochs",
                "200",
            ],
            env=cluster.launcher_env(),
            capture_output=True,
            text=True,
        )
        stop = subprocess.run(
            [LAUNCHER, "stop", "--env-file", str(cluster.env_file())],
            env=cluster.launcher_env(),
            capture_output=True,
            text=True,
        )
        print(
            f"cycle {cycle}: detached start exit {detached.returncode}, stop exit {stop.returncode}: "
            f"{stop.stdout.strip().replace(chr(10), '; ')}",
            flush=True,
        )
    print(f"soak: {cycles} cycles in {time.monotonic() - started:.0f} s; left on the nodes: {leftovers(cluster)}")


def cold_start(cluster: Cluster, nodes: list[str], *flags: str) -> tuple[float, list[str]]:
    """Seconds from `launcher start` to the first training step, and the launcher's image lines."""
    started = time.monotonic()
    process = subprocess.Popen(
        [
            LAUNCHER,
            "start",
            "--env-file",
            str(cluster.env_file()),
            "--nodes",
            ",".join(nodes),
            *flags,
            "--",
            "--dataset",
            "digits",
            "--epochs",
            "1",
        ],
        env=cluster.launcher_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    first_step = next((time.monotonic() - started for line in process.stdout if "epoch 1 [" in line), float("nan"))
    process.wait()
    stderr = process.stderr.read()
    assert process.returncode == 0, stderr[-3000:]
    return first_step, [
        line.split("] ", 1)[-1] for line in stderr.splitlines() if "image loaded" in line or " pulled " in line
    ]


def push_scaling() -> None:
    """Three fresh test hosts: a cold launch on node_1 alone, then (node_1's copy removed) on all three."""
    cluster = Cluster(Path("/var/lib/horovod-stack-test") / uuid.uuid4().hex[:8])
    try:
        cluster.start(3)
        nodes = ["node_1", "node_2", "node_3"]
        one, one_lines = cold_start(cluster, nodes[:1], "--push-image")
        cluster.nodes[0].client().images.remove(IMAGE, force=True)
        three, three_lines = cold_start(cluster, nodes, "--push-image")
        print(
            f"cold launch with --push-image, start to first training step: 1 node {one:.0f} s, 3 nodes {three:.0f} s "
            f"({three / one:.2f}x)\n  1 node: {one_lines}\n  3 nodes: {three_lines}",
            flush=True,
        )
        for node in cluster.nodes:
            node.client().images.remove(IMAGE, force=True)
        from tests.registry import Registry

        with Registry() as registry:
            pushed, _ = registry.push(IMAGE, "horovod-stack:bench")
            remote = f"{cluster.bridge_address}:{registry.port}/horovod-stack:bench"
            pulled, lines = cold_start(cluster, nodes, "--image", remote)
        print(
            f"cold launch from a registry (pushed there in {pushed:.0f} s), 3 fresh nodes pulling at once: first "
            f"training step after {pulled:.0f} s\n  {lines}",
            flush=True,
        )
    finally:
        cluster.stop()


def lost_node() -> None:
    from tests.test_launcher_multihost import BackgroundLaunch, first_step_after, kill_worker

    cluster = Cluster(Path("/var/lib/horovod-stack-test") / uuid.uuid4().hex[:8])
    try:
        cluster.start(2, spares=1)
        env_file = str(cluster.env_file())

        def training(name: str, *flags: str, resume: bool = False) -> BackgroundLaunch:
            return BackgroundLaunch(
                cluster,
                "start",
                "--env-file",
                env_file,
                *flags,
                "--",
                "--dataset",
                "synthetic",
                "--epochs",
                "12",
                "--checkpoint-dir",
                f"/shared/runs/{name}/ck",
                *(["--resume"] if resume else []),
            )

        restarted = training("restarted", "--push-image", "--max-restarts", "1", "--spares", "node_3")
        restarted.wait_for("epoch 2/12:", timeout=900)  # after the image's copy to all three
        lost = kill_worker(cluster, "node_2")
        spare_step = first_step_after(restarted, restarted.wait_for("resuming from")) - lost
        spare_status, _, _ = restarted.finish()

        failed = training("manual")
        failed.wait_for("epoch 2/12:")
        lost = kill_worker(cluster, "node_2")
        failed_status, _, _ = failed.finish()
        ended = time.monotonic() - lost
        again = training("manual", "--nodes", "node_1,node_3", resume=True)  # the node left and the spare
        manual_step = first_step_after(again, again.wait_for("resuming from")) - lost
        again_status, _, _ = again.finish()
        print(
            "| a node lost after epoch 2 of 12 | the job | first training step after the loss |\n|---|---|---|\n"
            f"| --max-restarts 1 --spares node_3 | went on (exit {spare_status}) | {spare_step:.0f} s |\n"
            f"| manual re-run on node_1,node_3 --resume | failed (exit {failed_status}) {ended:.0f} s after the "
            f"loss; the re-run exited {again_status} | {manual_step:.0f} s, plus the time until someone notices |",
            flush=True,
        )
    finally:
        cluster.stop()


def main() -> None:
    if sys.argv[1:2] == ["--push"]:
        push_scaling()
        return
    if sys.argv[1:2] == ["--lost-node"]:
        lost_node()
        return
    cluster = Cluster(Path("/var/lib/horovod-stack-test") / uuid.uuid4().hex[:8])
    try:
        cluster.start(2)
        cluster.load_image(IMAGE, cluster.nodes[0])
        if sys.argv[1:2] == ["--soak"]:
            cluster.load_image(IMAGE, cluster.nodes[1])
            soak(cluster, int(sys.argv[2]))
            return
        time_to_first_step(cluster, "cold (image pushed to node_2)", "--push-image")
        time_to_first_step(cluster, "warm")
        time_to_first_step(cluster, "warm")
        node_2 = cluster.nodes[1]
        failure(
            cluster,
            "worker killed",
            lambda _: node_2.client().containers.list(filters={"label": "horovod-stack.node=node_2"})[0].kill(),
        )
        failure(cluster, "Ctrl-C", lambda process: process.send_signal(signal.SIGINT))
        cluster.listen_on(node_2, 12345)
        started = time.monotonic()
        result = subprocess.run(
            [LAUNCHER, "start", "--env-file", str(cluster.env_file())],
            env=cluster.launcher_env(),
            capture_output=True,
            text=True,
        )
        errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
        print(
            f"port taken: exit {result.returncode} after {time.monotonic() - started:.1f} s; {errors}; "
            f"left: {cluster.project_containers()}"
        )
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
