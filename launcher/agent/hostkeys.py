"""Host keys learnt at first contact, for the launch methods whose workers share no folder with rank 0's container that
only they could publish in: an MPIJob's pods (the operator hands over no host keys) and compose's services (replicas of
one service would share one writable folder, and any worker could then replace another's key).

The agent reads each worker's ed25519 host key as its sshd offers it (ssh-keyscan, inside the cluster's own network,
before the job starts: no job code runs on any worker yet) and stores it where the launcher's published keys go
(HOSTKEYS_DIR); from then on pinning is as strict as for the published keys: mpirun, the agent's connections and elastic
discovery refuse a worker whose key changes during the job. This is trust on first use: it rests on the cluster's
network at the job's start (compose: the project's own bridge network, whose containers have no NET_RAW to spoof an
address; an MPIJob: the cluster's DNS and pod network, the ground the operator's own images stand on).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from launcher.agent.job import Agent
from launcher.agent.transport import Transport
from launcher.core.job import JobSpec, Worker
from launcher.core.protocol import HOSTKEYS_DIR, SSH_CONNECT_TIMEOUT_SECONDS

Scan = Callable[[str, int], str | None]


def keyscan(address: str, port: int) -> str | None:
    """The worker's ed25519 host key as 'TYPE BASE64', as its sshd offers it now; None while it does not answer."""
    try:
        done = subprocess.run(
            ["ssh-keyscan", "-T", str(SSH_CONNECT_TIMEOUT_SECONDS), "-p", str(port), "-t", "ed25519", address],
            capture_output=True,
            text=True,
            timeout=SSH_CONNECT_TIMEOUT_SECONDS + 5,
        )
    except subprocess.TimeoutExpired:
        return None
    for line in done.stdout.splitlines():
        words = line.split()
        if len(words) >= 3 and not line.startswith("#"):
            return f"{words[1]} {words[2]}"
    return None


class FirstContactAgent(Agent):
    """The job agent, pinning each worker's host key as learnt at its first contact (the module's docstring)."""

    def __init__(self, spec: JobSpec, transport: Transport, scan: Scan = keyscan, **kwargs) -> None:
        super().__init__(spec, transport, **kwargs)
        self.scan = scan

    def pin(self, worker: Worker) -> bool:
        learnt = f"{HOSTKEYS_DIR}/{worker.address}.pub"
        if not self.transport.read(learnt):
            key = self.scan(worker.address, self.spec.options.ssh_port)
            if not key:
                return False
            self.transport.write(learnt, key + "\n")
        return super().pin(worker)
