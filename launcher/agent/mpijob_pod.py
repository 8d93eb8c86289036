"""The MPIJob launch: a Kubeflow MPIJob's launcher pod (MPI Operator v0.8) as a JobSpec for the job agent.

    python -m launcher.agent.mpijob_pod [--job NAME] [--ssh-auth DIR] [--hostfile FILE] [--network-interface NIC]
                                        [--schedule-timeout S] [--ptrace] [--min-workers M] [--env KEY=VALUE]...
                                        -- COMMAND...

The pod starts with the workers (launcherCreationPolicy AtStartup), so the agent's wait for every worker's sshd is
the wait for the workers to be scheduled: as long as it takes, or --schedule-timeout seconds, after which the job
fails with the workers still missing named (and the MPIJob with it).

The operator finds the workers and writes them into its hostfile (MPIJOB_HOSTFILE: one `<job>-worker-<i>.<job>.<ns>.svc
slots=N` line each); everything after that is the agent's, as for the other launch methods: readiness, ssh connections,
mpirun over a hostfile of those same names and slots (given with --hostfile: Open MPI 5 ignores the operator's ORTE
variables), the exit status and root cause. The pod's arguments are the pod contract's (launcher/core/pod_contract.py):
`launcher export mpijob` (launcher/k8s/mpijob.py) writes them with agent_args, and this module reads them with parse
into the same JobOptions every launch method builds.

Keys: the operator mounts its Secret at sshAuthMountPath (MPIJOB_SSH_AUTH_DIR): id_rsa, id_rsa.pub and
authorized_keys, root-owned with mode 0644. The agent copies the private key to where the stack's ssh client reads
the cluster's key (CLUSTER_KEY, mode 0600); each worker's entrypoint copies authorized_keys for its sshd.

Host keys: the operator hands over none, so the agent learns each worker's at its first contact
(launcher/agent/hostkeys.py).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from launcher.agent.hostkeys import keyscan
from launcher.agent.job import Agent
from launcher.agent.transport import SshTransport, Transport, stop_on_signals
from launcher.agent.workers import JobError, Scan
from launcher.core.jobend import JobEnd
from launcher.core.jobspec import JobSpec, LaunchMethodFixes, Worker, new_run_id
from launcher.core.nics import IP_ADDRESSES, own_nic, parse_ip_addresses, subnet_of, virtual_subnets
from launcher.core.options import JobOptions, SettingsError, one_line
from launcher.core.pod_contract import PodArgs, parse
from launcher.core.protocol import (
    CLUSTER_KEY,
    JOB_SPEC,
    JOB_STATUS,
    MPIJOB_DISCOVERY,
    MPIJOB_HOSTFILE,
    MPIJOB_SSH_AUTH_DIR,
    RUNS_DIR,
)

DRIVER = "the MPIJob's launcher pod"
WORDS = LaunchMethodFixes(
    command_fix="use an image FROM horovod-stack:latest that has your code (launcher export mpijob --image), or put "
    "the code on the shared claim and run it from /shared",
    workers_fix="`kubectl get pods` and `kubectl describe pod` show why a worker pod is not running (Pending: no "
    "node has the free resources for it, or the namespace's quota is used up)",
    lost_hint="`kubectl describe pod` shows how the worker pod ended",
    unreached_hint="the MPI Operator removes the worker pods once the launcher pod has ended (cleanPodPolicy Running)",
)
RESULTS_HINT = "the MPIJob's shared claim (/shared in every pod)"


def hostfile_workers(text: str, path: str = MPIJOB_HOSTFILE) -> list[Worker]:
    """The workers in the operator's hostfile (`HOST slots=N` lines; `#` comments), in its order; each is named in
    logs by its pod's name (the host's first label)."""
    workers = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        slots = None
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key in ("slots", "max_slots") and not value.isdigit():
                raise SettingsError(f"{path} line {number}: {word!r} is not slots=N; the MPI Operator writes that file")
            if key == "slots":
                slots = int(value)
        workers.append(Worker(words[0].split(".")[0], words[0], slots))
    if not workers:
        raise SettingsError(f"{path} lists no workers; is this the launcher pod of an MPIJob with Worker replicas?")
    return workers


def job_spec(pod: PodArgs, hostfile_text: str, addresses: list[tuple[str, str]], now: float | None = None) -> JobSpec:
    """The job a launcher pod runs: the operator's workers with their slots; the bundled trainer writes into a run
    folder of its own on the shared claim (RUNS_DIR/<job>-<time>-<random>), so a second run never overwrites the
    first. With no NIC pinned, the virtual NICs of the launcher's own pod (a pod with host networking sees its node's)
    are left out, as the multi-host launcher does with each node's."""
    workers = hostfile_workers(hostfile_text, pod.hostfile)
    run_id = f"{pod.name}-{new_run_id(now)}"
    options = pod.options
    nic = options.network_interface
    subnet = subnet_of(nic)
    driver_nic = own_nic(nic, addresses) if subnet else None
    if subnet and options.elastic and not driver_nic:
        raise SettingsError(
            f"elastic training over the subnet {nic} needs an address in it in {DRIVER} (it has "
            f"{', '.join(f'{name} {address}' for name, address in addresses) or 'none'}); pass --network-interface "
            "to `launcher export mpijob` with a subnet or NIC the pods have"
        )
    return JobSpec(
        job_id=run_id,
        options=options,
        run_folder=f"{RUNS_DIR}/{run_id}",
        expected_workers=len(workers),
        slots=workers[0].slots or 1,
        workers=tuple(workers),
        excluded_subnets=() if nic else tuple(virtual_subnets(addresses)),
        across_hosts=True,
        driver_nic=driver_nic,
        discovery_script=MPIJOB_DISCOVERY,
        driver=DRIVER,
        results_hint=RESULTS_HINT,
        words=WORDS,
    )


def operator_key(ssh_auth: str) -> Callable[[Transport], None]:
    """The ssh client's set-up in the launcher pod: the operator's key pair, copied where ssh reads it."""

    def take(transport: Transport) -> None:
        private = transport.read(f"{ssh_auth}/id_rsa")
        if not private:
            raise JobError(
                f"no SSH key at {ssh_auth}/id_rsa: the MPI Operator mounts its Secret at the MPIJob's "
                f"sshAuthMountPath, which must be {ssh_auth}; export the job with `launcher export mpijob`"
            )
        transport.write(CLUSTER_KEY, private, 0o600)  # ssh refuses a private key that others may read

    return take


def operator_agent(spec: JobSpec, transport: Transport, ssh_auth: str, scan: Scan = keyscan, **kwargs) -> Agent:
    """The job agent with the operator's key pair and host keys learnt on first contact (the module's docstring)."""
    return Agent(spec, transport, scan=scan, setup=operator_key(ssh_auth), **kwargs)


def own_addresses() -> list[tuple[str, str]]:
    try:
        return parse_ip_addresses(subprocess.run(IP_ADDRESSES, capture_output=True, text=True).stdout)
    except OSError:
        return []


def fallback_spec(hostfile_text: str | None) -> JobSpec:
    """What the agent needs to tell the workers that a refused job has ended: where they are."""
    try:
        workers = tuple(hostfile_workers(hostfile_text or ""))
    except SettingsError:
        workers = ()
    return JobSpec(
        job_id="refused",
        options=JobOptions(launch_method="mpijob"),
        expected_workers=0,
        workers=workers,
        driver=DRIVER,
        words=WORDS,
    )


def main(argv: list[str]) -> int:
    """The launcher pod's job, start to end: its exit status is the job's."""
    transport = SshTransport()
    stop_on_signals(transport)
    hostfile_text: str | None = None
    ssh_auth = MPIJOB_SSH_AUTH_DIR
    try:
        pod = parse(argv)
        ssh_auth = pod.ssh_auth
        hostfile_text = transport.read(pod.hostfile)
        if hostfile_text is None:
            raise SettingsError(
                f"no {pod.hostfile}: the MPI Operator mounts it in an MPIJob's launcher pod; run this there"
            )
        spec = job_spec(pod, hostfile_text, own_addresses())
        transport.write(JOB_SPEC, spec.to_json())
    except (ValueError, OSError) as error:
        agent = operator_agent(fallback_spec(hostfile_text), transport, ssh_auth)
        try:
            return agent.refuse(one_line(error)).status
        except JobError:  # no key to tell the workers with: they stop when the operator removes the pods
            transport.write(JOB_STATUS, JobEnd(2, one_line(error)).to_json() + "\n")
            return 2
    return operator_agent(spec, transport, ssh_auth).run().status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
