"""What a start hands the worker containers before the job agent runs, through each node's engine (no shared folder
needed): the user's code folder (--workdir, copy_workdir) and the cluster's SSH trust (hand_over_trust: the cluster's
public key to every worker; the private key, every worker's host key as it made it, the secrets and the job spec to
rank 0's container, where the agent reads them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

from launcher.core import sshtrust
from launcher.core.protocol import (
    CLUSTER_KEY,
    CLUSTER_PRIVATE_DIR,
    CLUSTER_SSH_DIR,
    HOSTKEYS_DIR,
    JOB_SPEC,
    SECRETS_FILE,
    WORKDIR,
)
from launcher.host.engines.node_engine import Container, NodeEngine, on_each
from launcher.host.planning import workdir
from launcher.host.planning.plan import ClusterPlan
from launcher.host.running.rootcause import LaunchError


def hand_over_trust(
    plan: ClusterPlan,
    engines: Sequence[NodeEngine],
    containers: list[Container],
    keys: sshtrust.KeyPair,
    deadline: float,
    say: Callable[[str], None],
) -> None:
    """The cluster's public key to every worker; to rank 0's container the private key, every worker's host key (as
    the agent pins them) and the job spec the agent runs."""
    authorized = sshtrust.tar_files({"authorized_keys": (keys.public.encode() + b"\n", 0o600)})

    def authorize(worker: tuple[NodeEngine, Container]) -> tuple[str, str]:
        engine, container = worker
        engine.put_files(container.id, CLUSTER_SSH_DIR, authorized)
        return plan.mpi_host(engine.node), wait_for_host_key(engine, container, deadline)

    host_keys = dict(on_each(list(zip(engines, containers, strict=True)), authorize))
    rank0, container = engines[0], containers[0]
    private = {PurePosixPath(CLUSTER_KEY).name: (keys.private, 0o600)}
    if plan.settings.secret_values:  # the agent reads and removes it before the job runs
        private[PurePosixPath(SECRETS_FILE).name] = (json.dumps(plan.settings.secret_values).encode(), 0o600)
    rank0.put_files(container.id, CLUSTER_PRIVATE_DIR, sshtrust.tar_files(private))
    rank0.put_files(
        container.id,
        HOSTKEYS_DIR,
        sshtrust.tar_files({f"{host}.pub": (f"{key}\n".encode(), 0o644) for host, key in host_keys.items()}),
    )
    spec = PurePosixPath(JOB_SPEC)
    rank0.put_files(
        container.id,
        str(spec.parent),
        sshtrust.tar_files({spec.name: (plan.job_spec().to_json().encode(), 0o644)}),
    )
    say(
        "SSH trust handed over: cluster key in every worker; rank 0 holds the private key, the workers' host keys "
        "and the job"
    )


def copy_workdir(
    folder: str, engines: list[NodeEngine], containers: list[Container], say: Callable[[str], None]
) -> None:
    """The user's code folder to WORKDIR in every worker container, through the Docker API (no NFS needed)."""
    packed = workdir.pack(Path(folder))
    on_each(
        list(zip(engines, containers, strict=True)),
        lambda worker: worker[0].put_files(worker[1].id, WORKDIR, packed.archive),
    )
    say(f"code: {folder} copied to {WORKDIR} on {len(engines)} node(s) ({len(packed.archive) / 1024:.0f} KB)")
    skipped = workdir.skipped_line(packed.skipped)
    if skipped:
        say(f"code: {skipped}")


def wait_for_host_key(engine: NodeEngine, container: Container, deadline: float) -> str:
    node = engine.node.name
    while True:
        content = engine.read_file(container.id, f"{HOSTKEYS_DIR}/{node}.pub")
        if content:
            return " ".join(content.split()[:2])
        problem = engine.worker_problem(container.id)
        if problem:
            raise LaunchError(f"{node}: {problem}")
        if time.monotonic() > deadline:
            raise LaunchError(f"{node}: the worker made no SSH host key in time; see `launcher logs --node {node}`")
        time.sleep(0.5)
