"""Host keys learnt at first contact, for the launch methods whose workers share no folder with rank 0's container that
only they could publish in: an MPIJob's pods (the operator hands over no host keys) and compose's services (replicas of
one service would share one writable folder, and any worker could then replace another's key).

The agent reads each worker's ed25519 host key as its sshd offers it (ssh-keyscan, inside the cluster's own network,
before the job starts: no job code runs on any worker yet) and stores it where the launcher's published keys go
(HOSTKEYS_DIR); from then on pinning is as strict as for the published keys: mpirun, the agent's connections and elastic
discovery refuse a worker whose key changes during the job. This is trust on first use: it rests on the cluster's
network at the job's start (compose: the project's own bridge network, whose containers have no NET_RAW to spoof an
address; an MPIJob: the cluster's DNS and pod network, the ground the operator's own images stand on).

keyscan is the Workers service's `scan` for those launch methods (launcher/agent/workers.py: Workers.learn).
"""

from __future__ import annotations

import subprocess

from launcher.core.protocol import SSH_CONNECT_TIMEOUT_SECONDS


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
