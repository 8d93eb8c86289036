"""How a job ended, as one typed record (JobEnd) that crosses every process boundary: the agent writes it to
JOB_STATUS for the host (`launcher status`, `logs`, the launch's own end) and sends it over its ssh connection to each
worker, whose entrypoint reads the job's exit status from it. It carries the records of the job's end: its last run's
state (launcher/core/runs.py), each restart made and why the job was not started again (launcher/core/restart.py);
the host renders them. Pure: no side effects.

    python -m launcher.core.jobend exit-code RECORD   the job's exit status in a JobEnd record (e.g. 3), for bash
    python -m launcher.core.jobend line RECORD        the record in words ('exit status 2: CAUSE'), for a log line
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.core.restart import NotRestarted, Restart
from launcher.core.runs import RunResult, RunState


@dataclass(frozen=True)
class JobEnd:
    """How a job ended, as the agent records it in JOB_STATUS (a JSON object) for every host-side reader: its exit
    status; where the agent could tell, the one-line cause; the nodes its last run lost; the restarts it made; and,
    when restarts were allowed and it failed, why it was not started again."""

    status: int
    cause: str | None = None
    lost: tuple[str, ...] = ()
    """The nodes whose workers the last run lost."""
    restarts: tuple[Restart, ...] = ()
    """Each restart made."""
    not_restarted: NotRestarted | None = None
    """Why the job was not started again, when there is something to say (restarts allowed, and it failed)."""
    state: RunState | None = None
    """How its last run ended; None when none ran (the job was refused, or the agent failed before it ran)."""
    failed_rank: int | None = None
    """The rank that failed, when the agent could tell."""

    @classmethod
    def of_run(cls, run: RunResult, restarts: Sequence[Restart] = (), decision: NotRestarted | None = None) -> JobEnd:
        """The job's end after its last run `run`, the restarts before it and the decision not to start it again."""
        return cls(
            run.status,
            run.cause,
            tuple(loss.name for loss in run.lost),
            tuple(restarts),
            decision if decision is not None and decision.reason else None,
            run.state,
            run.failed_rank,
        )

    @property
    def succeeded(self) -> bool:
        return self.status == 0

    def root_cause(self, seen: str | None = None) -> str | None:
        """The one line that says why the job failed: `seen` (what the launcher saw end it, such as a killed worker)
        or the agent's own cause, with why it was not restarted; None when there is nothing to say."""
        cause = seen or self.cause
        why = self.not_restarted.reason if self.not_restarted else ""
        if cause and why and why not in cause:
            return f"{cause}; {why}"
        return cause

    def last_restart(self) -> str | None:
        """The last restart, as it was said; None when there was none."""
        return self.restarts[-1].line() if self.restarts else None

    def line(self) -> str:
        """'exit status 3', or 'exit status 2: ROOT CAUSE': the job's end in words (a worker's log says it)."""
        cause = self.root_cause()
        return f"exit status {self.status}" + (f": {cause}" if cause else "")

    def to_json(self) -> str:
        """JOB_STATUS's content, and the agent's last line to each worker: one line of JSON."""
        return json.dumps(
            {
                "status": self.status,
                "cause": self.cause,
                "lost": list(self.lost),
                "restarts": [done.to_record() for done in self.restarts],
                "not_restarted": self.not_restarted.to_record() if self.not_restarted else None,
                "state": self.state.value if self.state else None,
                "failed_rank": self.failed_rank,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> JobEnd | None:
        """to_json's record read back; None for anything else."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get("status"), int):
                return None
            not_restarted = data.get("not_restarted")
            return cls(
                data["status"],
                data.get("cause"),
                tuple(data.get("lost") or ()),
                tuple(Restart.from_dict(done) for done in data.get("restarts") or ()),
                NotRestarted.from_record(not_restarted) if not_restarted else None,
                RunState(data["state"]) if data.get("state") else None,
                data.get("failed_rank"),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def parse_job_end(text: str | None) -> JobEnd | None:
    """The JobEnd in JOB_STATUS or in the agent's last line to a worker (its first line); None for anything else (no
    record, a lost driver's words)."""
    first = (text or "").strip().splitlines()[:1]
    return JobEnd.from_json(first[0]) if first else None


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] in ("exit-code", "line"):
        end = parse_job_end(argv[1])
        if argv[0] == "exit-code":
            print(end.status if end else 1)
        else:
            print(end.line() if end else argv[1])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
