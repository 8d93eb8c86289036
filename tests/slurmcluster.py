"""A real Slurm cluster on this one machine, for the tests of the Slurm + Apptainer entry point.

One controller (slurmctld, also the login node users submit from, with the accounting database: slurmdbd and its
MariaDB) and two compute nodes (slurmd), each a privileged container of the node image (a Debian sid root with Slurm,
MariaDB, munge and Apptainer: `scripts/build-sif.sh node-image`)
on a Docker bridge network of the cluster's own, so each has its own network namespace, address and host name, and
an init that reaps the processes a job leaves to it, as a host's does (`sleep` would keep them as zombies).
Privileged, because slurmd starts jobs as their user and Apptainer, run by that unprivileged user, makes user
namespaces and mounts the SIF with FUSE. One munge key (made here, readable by root alone), one slurm.conf, one
user with the same uid everywhere, and one shared folder bind-mounted at SHARED on every node: the cluster's shared
file system (SIFs, job scripts, runs, checkpoints). Everything is created by `SlurmCluster.__enter__` and removed by
`__exit__` on every way out, a start that fails half-way included; a start fails in one message naming what did
not come up, with the daemons' logs.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEST_ROOT = Path("/var/lib/horovod-stack-test")
SHARED = "/shared"
"""The shared folder's path on every node."""
CONFIG = "/run/horovod-stack-slurm"
"""Where each node sees the cluster's configuration folder (slurm.conf, the munge key), read-only."""
USER = "researcher"
UID = 1000
"""The unprivileged user who submits jobs, the same on every node."""
CONTROLLER = "slurmctl"
NODES = ("node1", "node2")
CPUS_PER_NODE = 2
"""Each node offers 2 CPUs (this machine has 2 in all: the nodes' CPUs are oversubscribed)."""
LABEL = "horovod-stack.test=slurm"
START_TIMEOUT = 90.0
SLURMD_TIMEOUT = 10
"""How long the controller waits for a node's answer before it declares the node DOWN (slurm.conf SlurmdTimeout)."""
UNFINISHED = {"PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "COMPLETING", "CONFIGURING"}
"""Slurm's states of a job that has not ended yet."""


def slurm_conf(cluster: str) -> str:
    """The cluster's slurm.conf: no cgroups (a container's cgroup is not Slurm's to manage), processes tracked by
    their parent ids, no task binding. Jobs are accounted by the controller's slurmdbd (DBD_SETUP), so `sacct`
    shows how each ended; each ended job is a line of jobcomp.log too.
    A lost node is found as a site's Slurm finds one, only sooner: the controller pings each node every third of
    SlurmdTimeout and declares it DOWN when it has not answered for SlurmdTimeout (sites: 300 s); a requeued job
    starts again after requeue_delay (default: AuthInfo's cred_expire, 120 s); a node that registers again
    returns to service (ReturnToService=2)."""
    nodes = ",".join(NODES)
    return f"""ClusterName={cluster}
SlurmctldHost={CONTROLLER}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost={CONTROLLER}
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
MinJobAge=3600
KillWait=10
InactiveLimit=0
SlurmdTimeout={SLURMD_TIMEOUT}
SchedulerParameters=requeue_delay=1
NodeName={nodes} CPUs={CPUS_PER_NODE} State=UNKNOWN
PartitionName=main Nodes={nodes} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


CGROUP_CONF = "CgroupPlugin=disabled\n"
ACCOUNTING_DB = "slurm_acct_db"
SLURMDBD_CONF = f"""AuthType=auth/munge
DbdHost={CONTROLLER}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc={ACCOUNTING_DB}
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurmdbd.pid
"""
"""slurmdbd.conf: slurmdbd, run by root, reaches MariaDB on the controller by its socket as MariaDB's root, who signs
in there as the Unix user root (MariaDB's unix_socket authentication): no password to keep."""
DBD_SETUP = f"""set -eu
# MariaDB for slurmdbd, run by root on its socket alone, its data folder made here (the image has MariaDB's core
# packages, not mariadb-server's set-up), with the InnoDB settings slurmdbd checks at its start: no snapshot
# isolation (on since MariaDB 11.6; Slurm does not support it), the lock wait and buffer pool it advises (the pool
# is reserved, not filled: mariadbd keeps about 150 MB resident).
mariadb-install-db --user=root --skip-test-db
mkdir -p /run/mariadbd
setsid mariadbd --user=root --skip-networking --innodb-snapshot-isolation=OFF --innodb-lock-wait-timeout=900 \\
  --innodb-buffer-pool-size=1G </dev/null >/var/log/slurm/mariadb.log 2>&1 &
for _ in $(seq 100); do mariadb -e 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done
# The database made before slurmdbd starts: slurmdbd 26.05 makes a missing one itself, and then, on the connection
# whose first try found none, fails its first query (client error 5027, "_check_mysql_concat_is_sane: null result").
mariadb -e 'create database if not exists {ACCOUNTING_DB}'
install -m 0600 {CONFIG}/slurmdbd.conf /etc/slurm/slurmdbd.conf
slurmdbd
for _ in $(seq 100); do sacctmgr -n list cluster >/dev/null 2>&1 && exit 0; sleep 0.1; done
echo "slurmdbd did not answer sacctmgr" >&2
exit 1
"""
NODE_SETUP = f"""set -eu
# Apptainer, run by the user, mounts the SIF with squashfuse: the container's own /dev/fuse (a copy of the host's
# root-only node) is opened to all, as on a host with FUSE.
chmod 666 /dev/fuse
useradd -m -u {UID} -s /bin/bash {USER}
mkdir -p /etc/slurm /var/spool/slurmd /var/spool/slurmctld /var/log/slurm /run/munge
cp {CONFIG}/slurm.conf {CONFIG}/cgroup.conf /etc/slurm/
install -o munge -g munge -m 0400 {CONFIG}/munge.key /etc/munge/munge.key
chown munge:munge /run/munge
runuser -u munge -- munged
"""
NODE_RESTART = """set -eu
# A node started again after it was lost: its daemons' pid files are stale, its /dev is new.
chmod 666 /dev/fuse
rm -f /run/slurmd.pid /run/munge/munged.pid
runuser -u munge -- munged --force
slurmd
"""


def sh(
    *argv: str, check: bool = True, timeout: float = 120, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    """argv run here; `env`: variables added to this process's environment for it."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(argv[:3])} ... failed ({done.returncode}): {done.stderr.strip()}")
    return done


def node_image() -> str:
    """The node image's tag, made first if it is not here (debootstrap, about a minute)."""
    made = sh(str(REPO / "scripts" / "build-sif.sh"), "node-image", check=False, timeout=900)
    if made.returncode != 0:
        raise RuntimeError(f"making the Slurm node image failed:\n{made.stderr[-3000:]}")
    return made.stdout.strip().splitlines()[-1]


@dataclass
class JobResult:
    """How one ended job ended as Slurm's accounting database tells it (`sacct`), and its output."""

    job_id: str
    state: str
    exit_code: str
    nodes: str
    seconds: float
    output: str


ACCOUNTED = ("JobName", "State", "ExitCode", "NodeList", "Submit")
"""The fields of a job that `sacct` is asked for, the docs' `sacct -j JOB -X` with `-n -P` (no header, |-separated)."""


def accounted(shown: str) -> dict[str, str]:
    """`sacct -X -n -P -o ACCOUNTED`'s fields of the job's newest run (its last line: the only one, as -X and no
    --duplicates leave it), its State's first word (sacct writes a cancelled job's as `CANCELLED by UID`); none while
    the database has no record of it."""
    lines = shown.strip().splitlines()
    if not lines:
        return {}
    fields = dict(zip(ACCOUNTED, lines[-1].split("|"), strict=False))
    fields["State"] = fields.get("State", "").split(" ")[0]
    return fields


@dataclass
class SlurmCluster:
    """A controller and NODES, started by `with SlurmCluster(...) as cluster:` and removed on the way out.

    images: a folder of SIFs on this machine (scripts/build-sif.sh's cache), bind-mounted read-only at
    SHARED/images on every node; a SIF made there later shows there too."""

    image: str
    images: Path | None = None
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    folder: Path = Path()
    containers: list[str] = field(default_factory=list)
    network: str = ""
    start_seconds: float = 0.0

    @property
    def shared(self) -> Path:
        """The shared folder on this machine (SHARED on the nodes)."""
        return self.folder / "shared"

    @property
    def name(self) -> str:
        """Slurm's name for the cluster (ClusterName)."""
        return f"hs{self.suffix}"

    def container(self, host: str) -> str:
        return f"horovod-stack-slurm-{self.suffix}-{host}"

    def __enter__(self) -> SlurmCluster:
        started = time.monotonic()
        try:
            try:
                self._start()
            except (AssertionError, subprocess.SubprocessError) as error:
                raise RuntimeError(f"the Slurm cluster did not start: {error}\n{self.logs()}") from None
            self._wait_until_idle()
        except BaseException:
            self.__exit__()
            raise
        self.start_seconds = time.monotonic() - started
        return self

    def _start(self) -> None:
        TEST_ROOT.mkdir(parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(prefix="slurm-", dir=TEST_ROOT))
        config = self.folder / "config"
        config.mkdir(mode=0o700)
        (config / "slurm.conf").write_text(slurm_conf(self.name))
        (config / "cgroup.conf").write_text(CGROUP_CONF)
        (config / "slurmdbd.conf").write_text(SLURMDBD_CONF)
        key = config / "munge.key"
        key.touch(mode=0o400)
        key.write_bytes(secrets.token_bytes(128))
        self.shared.mkdir()
        os.chown(self.shared, UID, UID)
        self.network = f"horovod-stack-slurm-{self.suffix}"
        sh("docker", "network", "create", "--label", LABEL, self.network)
        mounts = ["-v", f"{self.shared}:{SHARED}", "-v", f"{config}:{CONFIG}:ro"]
        if self.images is not None:
            mounts += ["-v", f"{self.images}:{SHARED}/images:ro"]
        for host in (CONTROLLER, *NODES):
            self.containers.append(self.container(host))
            sh(
                "docker", "run", "-d", "--init", "--privileged", "--label", LABEL, "--name", self.container(host),
                "--hostname", host, "--network", self.network, "--network-alias", host, *mounts,
                self.image, "sleep", "infinity",
            )  # fmt: skip
        for host in (CONTROLLER, *NODES):
            self.run_root(host, NODE_SETUP)
        self.run_root(CONTROLLER, DBD_SETUP)
        self.run_root(CONTROLLER, "slurmctld")
        for host in NODES:
            self.run_root(host, "slurmd")

    def _wait_until_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        states = ""
        while time.monotonic() < deadline:
            shown = self.exec(CONTROLLER, "sinfo -h -N -o '%N %t'", check=False)
            states = shown.stdout.strip()
            if shown.returncode == 0 and sorted(states.splitlines()) == [f"{host} idle" for host in NODES]:
                return
            time.sleep(1)
        raise RuntimeError(
            f"the Slurm cluster did not come up in {START_TIMEOUT:.0f} s: sinfo shows {states or 'nothing'!r}, "
            f"not {', '.join(NODES)} idle\n{self.logs()}"
        )

    def logs(self) -> str:
        parts = []
        for host in (CONTROLLER, *NODES)[: len(self.containers)]:
            tail = self.exec(host, "tail -n 30 /var/log/slurm/*.log 2>&1", user="root", check=False)
            parts.append(f"--- {host}\n{tail.stdout}{tail.stderr}")
        return "\n".join(parts)

    def __exit__(self, *_: object) -> None:
        for name in self.containers:
            sh("docker", "rm", "-f", "-v", name, check=False)
        self.containers.clear()
        if self.network:
            sh("docker", "network", "rm", self.network, check=False)
            self.network = ""
        if self.folder != Path() and self.folder.exists():
            shutil.rmtree(self.folder)

    # --- running things on the nodes
    def exec(
        self,
        host: str,
        command: str,
        user: str = USER,
        check: bool = True,
        timeout: float = 120,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        """`bash -lc command` on one host, as `user` (the submitting user unless told), in SHARED; `env`: variables
        exported in its shell, their values handed over by name (`docker exec -e NAME`), never on a command line."""
        names = [word for name in env or {} for word in ("-e", name)]
        done = sh(
            "docker", "exec", "-u", user, "-w", SHARED, *names, self.container(host), "bash", "-c", command,
            check=False, timeout=timeout, env=env,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"{command!r} on {host} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return done

    def address(self, host: str) -> str:
        """The host's address on the cluster's network."""
        field = f'{{{{(index .NetworkSettings.Networks "{self.network}").IPAddress}}}}'
        return sh("docker", "inspect", "-f", field, self.container(host)).stdout.strip()

    def lose(self, host: str) -> None:
        """The node dies as a host does: every process at once (SIGKILL), its network gone with no reset sent."""
        sh("docker", "kill", self.container(host))

    def bring_back(self, host: str, address: str) -> None:
        """A lost node started again (its container, munge, slurmd: it registers and Slurm returns it to service),
        at the address it had (`address`), which Slurm's controller keeps for it."""
        sh("docker", "start", self.container(host))
        back = self.address(host)
        if back != address:
            raise AssertionError(f"{host} came back at {back}, not at {address}, where Slurm looks for it")
        self.run_root(host, NODE_RESTART)

    def run_root(self, host: str, command: str) -> None:
        self.exec(host, command, user="root")

    def submit(self, script: str, name: str, env: Mapping[str, str] | None = None) -> str:
        """Writes the batch script to SHARED/jobs/NAME.sbatch and sbatch's it as USER from that folder, `env`
        exported in the shell that runs sbatch; returns the job id. The job's name and output file are the script's
        own (#SBATCH --job-name, --output): its output is output_file(NAME, JOB)."""
        jobs = self.shared / "jobs"
        jobs.mkdir(exist_ok=True)
        os.chown(jobs, UID, UID)
        path = jobs / f"{name}.sbatch"
        path.write_text(script)
        os.chown(path, UID, UID)
        submitted = self.exec(CONTROLLER, f"cd jobs && sbatch --parsable {name}.sbatch", env=env)
        return submitted.stdout.strip().split(";")[0]

    def output_file(self, name: str, job_id: str) -> Path:
        """Where a job's output is on this machine: the exported script's `#SBATCH --output=%x-%j.out` (its name and
        ID) in the folder sbatch ran in (`submit`'s SHARED/jobs)."""
        return self.shared / "jobs" / f"{name}-{job_id}.out"

    def wait(self, job_id: str, timeout: float) -> JobResult:
        """Waits until the job has ended and `sacct` shows its end; its state, exit code, nodes and name as sacct
        tells them, and its output (output_file). The controller is asked too (`scontrol show job`), as a gate only:
        sacct alone cannot tell a job that ended from one requeued a moment ago, whose newest record is its last run's
        until the controller's news of the requeue reaches slurmdbd; so the run sacct shows must be the one the
        controller shows ended (the same state and submit time: a requeue submits the job anew)."""
        started = time.monotonic()
        fields: dict[str, str] = {}
        while time.monotonic() - started < timeout:
            controller, fields = self.job(job_id), self.accounting(job_id)
            run = (controller.get("JobState", "PENDING"), controller.get("SubmitTime"))
            if run[0] not in UNFINISHED and (fields.get("State"), fields.get("Submit")) == run:
                break
            time.sleep(1)
        else:
            self.exec(CONTROLLER, f"scancel {job_id}", check=False)
            raise AssertionError(f"job {job_id} not ended after {timeout:.0f} s (sacct: {fields})\n{self.logs()}")
        output = self.output_file(fields["JobName"], job_id)
        text = output.read_text(errors="replace") if output.exists() else ""
        seconds = time.monotonic() - started
        return JobResult(job_id, fields["State"], fields["ExitCode"], fields["NodeList"], seconds, text)

    def accounting(self, job_id: str) -> dict[str, str]:
        """sacct's ACCOUNTED fields of the job's newest run, asked as the submitting user (none before slurmdbd has
        its record)."""
        shown = self.exec(CONTROLLER, f"sacct -j {job_id} -X -n -P -o {','.join(ACCOUNTED)}", check=False)
        return accounted(shown.stdout)

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job`'s fields of one job (none while the controller does not know it)."""
        shown = self.exec(CONTROLLER, f"scontrol -o show job {job_id}", check=False).stdout
        return dict(word.split("=", 1) for word in shown.split() if "=" in word)
