"""The Workers service: the agent's contact with its workers, however the job was launched: which workers the job may
use, their host keys pinned (never trusted over the network; or learnt at first contact, launcher/agent/hostkeys.py),
an ssh connection to each (it ends when the job ends, or when the agent dies), which ones were lost during the run and
how, whether each can start the command, every rank's stack on them, and the last word each is told. Also the agent's
log line (say) and the one error the agent names a fix in (JobError).

The job agent (launcher/agent/job.py), its restarts (launcher/agent/restarter.py) and the watches beside the running
job (launcher/agent/watches.py) each use one Workers; host discovery and `stacks` (launcher/agent/__main__.py) use one
without an agent. Its state (connections, lost workers) is its own: others ask and tell through its methods.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable

from launcher.agent import stacks
from launcher.agent.transport import Lifeline, Transport
from launcher.core.jobspec import JobSpec, Worker, command_probe, pin_known_host
from launcher.core.protocol import (
    AGENT,
    AGENT_LINK,
    HOSTKEYS_DIR,
    JOB_LOST,
    KEEPALIVE_INTERVAL_SECONDS,
    KNOWN_HOSTS,
    SILENCE_SECONDS,
    SSH_CONNECT_TIMEOUT_SECONDS,
    STACKS,
    WORKER_CLAIMED,
    agent_line,
)
from launcher.core.runs import LostWorker

DISCOVERY_SSH_TIMEOUT = 2

Say = Callable[[str], None]
Scan = Callable[[str, int], str | None]
"""Reads a worker's host key as its sshd offers it now ('TYPE BASE64'; None while it does not answer)."""


def say(message: str) -> None:
    print(agent_line(time.strftime("%H:%M:%S"), message), flush=True)


class JobError(RuntimeError):
    """The job could not run, or failed for a reason the agent can name; one line naming the fix."""


def lifeline_command(driver: str) -> str:
    return shlex.join([*AGENT, AGENT_LINK, "--driver", driver])


def lost_addresses(text: str | None) -> set[str]:
    """The addresses in JOB_LOST."""
    return set((text or "").split())


class Workers:
    """The job's workers and the agent's ssh connections to them (the module's docstring). `scan`: learn each
    worker's host key at first contact (launcher/agent/hostkeys.py) instead of reading the one it published."""

    def __init__(
        self,
        spec: JobSpec,
        transport: Transport,
        say: Say = say,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        scan: Scan | None = None,
    ) -> None:
        self._spec = spec
        self.transport, self.say, self.clock, self.sleep, self.scan = transport, say, clock, sleep, scan
        self._lifelines: dict[str, Lifeline] = {}
        """Open connections to workers, by worker address."""
        self._claimed: dict[str, Worker] = {}
        """Every worker a connection was opened to, by address."""
        self._lost: dict[str, LostWorker] = {}
        """Workers lost during the run and not claimed again, by address."""
        self._running: set[str] = set()
        """The addresses of the workers the job runs on now (not a spare's)."""

    @property
    def spec(self) -> JobSpec:
        """The job as it runs now: its first run's, or its latest restart's (use)."""
        return self._spec

    def use(self, spec: JobSpec) -> None:
        """From now on the job is `spec` (a restart's: its run number, its workers)."""
        self._spec = spec

    def start_run(self, workers: list[Worker]) -> None:
        """The job runs on `workers` now (the others claimed are spares)."""
        self._running = {worker.address for worker in workers}

    def runs_on(self, address: str) -> bool:
        return address in self._running

    # --- finding and trusting workers -----------------------------------------------------------------------------
    def candidates(self) -> list[Worker]:
        """The workers this job may use right now: the launcher's fixed list, or what the service name resolves to."""
        if self.spec.workers:
            return list(self.spec.workers)
        if self.spec.worker_service:
            return [Worker(address, address) for address in self.transport.resolve(self.spec.worker_service)]
        return []

    def pin(self, worker: Worker) -> bool:
        """Pins the host key the worker published (read from the cluster's files, never trusted over the network), or
        the one learnt at first contact (`scan`); False while there is none."""
        if self.scan is not None and not self.learn(worker):
            return False
        key = self.transport.read(f"{HOSTKEYS_DIR}/{worker.address}.pub")
        if not key or len(key.split()) < 2:
            return False
        known = self.transport.read(KNOWN_HOSTS) or ""
        updated = pin_known_host(known, worker.address, self.spec.options.ssh_port, key)
        if updated != known:
            self.transport.write(KNOWN_HOSTS, updated, 0o600)
        return True

    def learn(self, worker: Worker) -> bool:
        """The worker's host key as learnt at first contact (stored where published keys go, HOSTKEYS_DIR, and pinned as
        strictly from then on); False while its sshd does not answer."""
        learnt = f"{HOSTKEYS_DIR}/{worker.address}.pub"
        if self.transport.read(learnt):
            return True
        key = self.scan(worker.address, self.spec.options.ssh_port) if self.scan else None
        if not key:
            return False
        self.transport.write(learnt, key + "\n")
        return True

    def answers(self, worker: Worker, timeout: float = SSH_CONNECT_TIMEOUT_SECONDS) -> bool:
        return self.pin(worker) and self.transport.ssh(worker.address, "true", timeout)[0] == 0

    def check_command(self, workers: list[Worker]) -> None:
        """Every worker can start the command, or one line naming the worker and the fix, before mpirun."""
        spec = self.spec
        probe = f"cd {shlex.quote(spec.cwd)} && {shlex.join(command_probe(spec.command))}"
        for worker in workers:
            code, output = self.transport.ssh(worker.address, probe, SSH_CONNECT_TIMEOUT_SECONDS + 20)
            if code != 0:
                why = (output.strip().splitlines() or [f"exit status {code}"])[-1]
                raise JobError(
                    f"{worker.name}: cannot start `{' '.join(spec.command)}` in {spec.cwd}: {why}; "
                    f"{spec.words.command_fix}"
                )

    # --- connections and lost workers ----------------------------------------------------------------------------
    def claim(self, workers: list[Worker]) -> None:
        """An ssh connection to every worker that has none open: it ends when the job ends, or when this agent dies."""
        for worker in workers:
            line = self._lifelines.get(worker.address)
            if line is None or not line.alive():
                self._lifelines[worker.address] = self.transport.lifeline(
                    worker.address, lifeline_command(self.spec.driver)
                )
                self._claimed[worker.address] = worker

    def unclaimed(self) -> list[Worker]:
        """The candidates with no open connection (never claimed, or their connection closed)."""
        return [
            worker
            for worker in self.candidates()
            if not (line := self._lifelines.get(worker.address)) or not line.alive()
        ]

    def newly_closed(self) -> list[tuple[str, LostWorker]]:
        """The claimed workers whose connection closed and that are not yet marked lost, by address."""
        return [
            (address, LostWorker(self._claimed[address].name, line.silent()))
            for address, line in list(self._lifelines.items())
            if not line.alive() and address not in self._lost
        ]

    def is_lost(self, address: str) -> bool:
        return address in self._lost

    def lost(self) -> dict[str, LostWorker]:
        """The workers lost during the run and not claimed again, by address."""
        return dict(self._lost)

    def claimed(self) -> list[Worker]:
        """Every worker a connection was opened to."""
        return list(self._claimed.values())

    def unclaimed_since_start(self, worker: Worker) -> bool:
        """The worker has never been claimed since its container started: a new worker, not a lost one that came
        back (that one stops by itself once it notices its agent's connection closed)."""
        return self.transport.ssh(worker.address, f"test ! -e {WORKER_CLAIMED}", DISCOVERY_SSH_TIMEOUT)[0] == 0

    def mark_lost(self, address: str, loss: LostWorker | None) -> None:
        """Records a worker as lost or, with None, claimed again; JOB_LOST tells host discovery."""
        if loss is None:
            self._lost.pop(address, None)
        else:
            self._lost[address] = loss
        if self.spec.elastic:
            self.transport.write(JOB_LOST, "".join(f"{lost}\n" for lost in sorted(self._lost)))

    def loss(self, worker: Worker) -> LostWorker | None:
        """How the worker was lost during the run, or None while its connection holds and it answers."""
        if worker.address in self._lost:
            return self._lost[worker.address]
        line = self._lifelines.get(worker.address)
        if line is not None and not line.alive():
            return LostWorker(worker.name, line.silent())
        if line is None or not self.answers(worker, DISCOVERY_SSH_TIMEOUT):
            return LostWorker(worker.name, line is not None and self.went_silent(line))
        return None

    def went_silent(self, line: Lifeline) -> bool:
        """Whether a connection whose worker does not answer closes for silence (mpirun may notice a silent node just
        before the connection does): waits for it to close, SILENCE_SECONDS and one keepalive round at most."""
        deadline = self.clock() + SILENCE_SECONDS + KEEPALIVE_INTERVAL_SECONDS
        while line.alive() and self.clock() < deadline:
            self.sleep(0.5)
        return line.silent()

    def losses(self, ready: list[Worker]) -> list[LostWorker]:
        """The workers a run that failed lost."""
        return [loss for worker in ready if (loss := self.loss(worker))]

    # --- every rank's stack ---------------------------------------------------------------------------------------
    def report_stacks(self, workers: list[Worker], heading: str) -> str:
        """`heading`, then every rank's stack into the job's log; returns their summary (where the odd ranks out
        are), or "" when no rank's stack could be taken."""
        if not self.spec.options.ptrace:
            self.say(f"{heading}; {stacks.NO_PTRACE}")
            return ""
        self.say(f"{heading}; every rank's stack:")
        found = self.gather_stacks(workers)
        for line in stacks.report(found).splitlines():
            self.say(line)
        return stacks.summary(found) if found else ""

    def gather_stacks(self, workers: list[Worker], native: bool = False) -> list[stacks.RankStack]:
        """Every rank's stack on every worker (py-spy in each worker container, over ssh); a worker that cannot
        say is named in the agent's log."""
        found: list[stacks.RankStack] = []
        for worker in workers:
            command = shlex.join([*STACKS, "collect", "--node", worker.name, *(["--native"] if native else [])])
            code, output = self.transport.ssh(worker.address, command, stacks.PY_SPY_TIMEOUT_SECONDS * 4)
            try:
                found += stacks.from_json(output.strip().splitlines()[-1]) if code == 0 else []
            except (ValueError, KeyError, IndexError):
                code = code or 1
            if code != 0:
                self.say(f"{worker.name}: no stacks ({(output.strip().splitlines() or ['no answer'])[-1]})")
        return found

    # --- the last word --------------------------------------------------------------------------------------------
    def tell_all(self, workers: list[Worker], message: str, patience: float = 0) -> None:
        """Every open connection gets the word before any is waited on. A worker whose connection closed has recorded
        that itself and stopped: one more word costs a short try. One never claimed is told over a new connection,
        retried for `patience` seconds."""
        lines = {
            worker.address: self._lifelines[worker.address] for worker in workers if worker.address in self._lifelines
        }
        sent = {address: line for address, line in lines.items() if line.alive()}
        for line in sent.values():
            line.send(message)
        for worker in workers:
            if worker.address in lines and worker.address not in sent:
                self.tell(worker, message, timeout=DISCOVERY_SSH_TIMEOUT)
        deadline = self.clock() + patience
        pending = [worker for worker in workers if worker.address not in lines]
        while pending:
            pending = [worker for worker in pending if not self.tell(worker, message)]
            if not pending or self.clock() > deadline:
                break
            self.sleep(1)
        for line in sent.values():
            line.wait()
        if pending:
            self.say(
                f"could not reach {', '.join(worker.name for worker in pending)} to say the job ended; "
                + self.spec.words.unreached_hint
            )

    def tell(self, worker: Worker, message: str, timeout: float = SSH_CONNECT_TIMEOUT_SECONDS) -> bool:
        command = lifeline_command(self.spec.driver)
        return self.pin(worker) and self.transport.ssh(worker.address, command, timeout, stdin=message + "\n")[0] == 0
