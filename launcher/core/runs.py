"""One run of a job (mpirun or elastic horovodrun, once) and how it ended, as a typed record: the job agent's run
returns a RunResult (launcher/agent/job.py), the restart decision reads it (launcher/core/restart.py), and the job's
end record carries what the host shows of it (launcher/core/jobend.py's JobEnd). Pure data, no side effects.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from launcher.core.protocol import SILENCE_SECONDS


class RunState(StrEnum):
    """How a run ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """The job's command exited non-zero and no worker was lost: the script itself failed."""
    WORKERS_LOST = "workers_lost"
    """One or more of its workers were lost (their container stopped, or they went silent)."""
    TIMED_OUT = "timed_out"
    """Its time limit ended it."""
    STALLED = "stalled"
    """The stall watch ended it (stall action fail)."""

    @property
    def ended_by_watch(self) -> str | None:
        """What ended the run when one of the agent's watches did (such a run is not restarted), in words."""
        return {RunState.TIMED_OUT: "its time limit", RunState.STALLED: "the stall watch (stall action fail)"}.get(self)


@dataclass(frozen=True)
class LostWorker:
    """A worker lost during the run: its connection closed (its container stopped or was killed), or it went silent."""

    name: str
    silent: bool

    def __str__(self) -> str:
        if self.silent:
            return f"{self.name} went silent (no answer for {SILENCE_SECONDS} s: link down, host down or powered off)"
        return f"{self.name}: worker lost during the run"

    def short(self) -> str:
        """As one of a list of lost workers."""
        return f"{self.name} (silent for {SILENCE_SECONDS} s)" if self.silent else self.name

    def reason(self) -> str:
        """As the reason for a restart."""
        return f"{self.name} went silent" if self.silent else f"{self.name}'s worker was lost"


@dataclass(frozen=True)
class RunResult:
    """How one run ended: its state, its exit status, the one-line cause where the agent could tell, the workers it
    lost, and the failed rank when known (as torchrun's RunResult: a state, then what failed)."""

    state: RunState
    status: int
    cause: str | None = None
    lost: tuple[LostWorker, ...] = ()
    failed_rank: int | None = None
