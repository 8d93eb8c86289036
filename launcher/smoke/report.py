"""A smoke run's outcome: the verdict, its last line, its exit status and its JUnit XML report (pure functions).

The last line is `smoke: passed: 2 ranks over Gloo in 41 s`, or `smoke: failed: WHY`, WHY being the first rank to fail
(`rank 1 exited with status 1: <its error>`, from its record: launcher/smoke/output.py), the timeout (`timed out after
600 s: <where the ranks were>`), horovodrun's own failure, or the bundled trainer's check. The JUnit report holds one
test case per rank and one for the job, which GitHub's and GitLab's test report views show.
"""

from __future__ import annotations

import re
import signal
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from launcher.core import legacy_keras
from launcher.smoke import shm
from launcher.smoke.output import JobLog, last_error_line

TIMEOUT_STATUS = 124
"""The exit status of a run that timed out, as coreutils' timeout(1) gives."""
SUITE = "smoke"
XML_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
"""Characters XML 1.0 cannot hold (a progress bar's escape codes): dropped from the report."""


@dataclass(frozen=True)
class RankResult:
    rank: int
    status: int | None
    """Its exit status; None: it was still running when the timeout ended it, or never reported one."""
    error: str | None = None
    """Its last error line, when it failed."""
    output: str = ""
    """Its recent output."""
    stack: str = ""
    """At a timeout: where it was, innermost frame first."""
    after: int | None = None
    """The rank whose failure ended this one (horovodrun ends the others), if another's did."""
    untold: bool = False
    """It failed first, and horovodrun ended it without a line saying how it exited (status is None then)."""

    def problem(self) -> str | None:
        """Why this rank's test case failed; None: it passed."""
        if self.untold:
            return f"failed first, then horovodrun ended it: {self.error}" if self.error else "failed first"
        if self.status is None:
            return f"still running at the timeout{': ' + self.stack.splitlines()[0] if self.stack else ''}"
        if self.status != 0:
            text = exited(self.rank, self.status, None).removeprefix(f"rank {self.rank} ")
            text += f" after rank {self.after} failed" if self.after is not None else ""
            return f"{text}: {self.error}" if self.error else text
        return None


@dataclass(frozen=True)
class Outcome:
    size: int
    seconds: float
    ranks: tuple[RankResult, ...]
    failure: str | None = None
    """None: the run passed."""
    status: int = 0
    """The exit status: 0, the first failing rank's, 124 after the timeout, 1 when the trainer's check fails."""
    timed_out: bool = False

    @property
    def passed(self) -> bool:
        return self.failure is None

    @property
    def job_name(self) -> str:
        return f"{self.size} rank{'s' if self.size != 1 else ''} over Gloo"


def exited(rank: int, status: int, error: str | None) -> str:
    """`rank 1 exited with status 1: <error>`, or the signal that ended it (a negative status)."""
    if status < 0:
        try:
            name = f" ({signal.Signals(-status).name})"
        except ValueError:
            name = ""
        text = f"rank {rank} was killed by signal {-status}{name}"
    else:
        text = f"rank {rank} exited with status {status}"
    return f"{text}: {error}" if error else text


def exit_status(status: int) -> int:
    """A rank's status as a process exit status: a signal N as 128+N, as shells give it."""
    if status < 0:
        return 128 - status
    return status if 0 < status < 256 else 1


def judge(
    log: JobLog,
    returncode: int,
    seconds: float,
    timeout: float | None = None,
    where: str = "",
    stacks: dict[int, str] | None = None,
    check: str | None = None,
    exits: list[tuple[int, int]] | None = None,
    shared_memory: int | None = None,
    environment: tuple[str, ...] = (),
) -> Outcome:
    """The run's outcome from its output, horovodrun's status, and (timeout given) the timeout and the ranks' stacks;
    check: why the bundled trainer's own check failed, if it did; exits: the ranks' non-zero exits that count (by
    default all of the log's; after a timeout, those before it); shared_memory: /dev/shm's size, told with the error
    of a rank that ran out of it; environment: the ranks' KEY=VALUE words (their environment, an `env` in front of
    the command), for a rank that died of Keras 2 code on Keras 3 (told with its fix unless Keras 2 was asked for)."""
    stacks = stacks or {}
    exits = log.exits if exits is None else exits
    ended = dict(reversed(exits))  # the first exit line of a rank wins
    ranks_ran = returncode == 0 or bool(exits) or any(rank.tail for rank in log.ranks.values())

    def status_of(rank: int) -> int | None:
        if rank in ended:
            return ended[rank]
        return None if timeout is not None or not ranks_ran else 0

    culprit = log.culprit(exits)

    def error_of(number: int) -> str | None:
        rank = log.ranks[number]
        error = rank.last_error()
        if shm.ran_out(rank.text()):
            return shm.explained(error, shared_memory)
        if legacy_keras.keras2_on_keras3([line.text for line in rank.tail], environment):
            return legacy_keras.explained(error, "smoke")
        return error

    def result(number: int) -> RankResult:
        untold = timeout is None and number == culprit and number not in ended
        status = None if untold else status_of(number)
        error = error_of(number) if status or untold else None
        after = culprit if status and culprit is not None and culprit != number else None
        return RankResult(number, status, error, log.ranks[number].text(), stacks.get(number, ""), after, untold)

    ranks = tuple(result(number) for number in sorted(log.ranks))

    def outcome(failure: str | None = None, status: int = 0, timed_out: bool = False) -> Outcome:
        return Outcome(log.size, seconds, ranks, failure, status, timed_out)

    if timeout is not None:
        failure = f"timed out after {timeout:.0f} s" + (f": {where}" if where else "")
        return outcome(failure=failure, status=TIMEOUT_STATUS, timed_out=True)
    if culprit is not None:
        error = error_of(culprit)
        if culprit == exits[0][0]:
            return outcome(failure=exited(culprit, ended[culprit], error), status=exit_status(ended[culprit]))
        # It reported its error first, but another rank exited first and horovodrun ended this one.
        failure = f"rank {culprit} failed first" + (f": {error}" if error else "")
        return outcome(failure=failure, status=exit_status(returncode) or 1)
    if returncode != 0:
        why = last_error_line(tuple(log.driver))
        failure = f"horovodrun exited with status {returncode}" + (f": {why}" if why else "")
        return outcome(failure=failure, status=exit_status(returncode))
    if check:
        return outcome(failure=check, status=1)
    return outcome()


def result_line(outcome: Outcome) -> str:
    """The run's last line."""
    if outcome.passed:
        return f"smoke: passed: {outcome.job_name} in {outcome.seconds:.0f} s"
    return f"smoke: failed: {outcome.failure}"


def _clean(text: str) -> str:
    return XML_UNSAFE.sub("", text)


def junit_xml(outcome: Outcome, timestamp: float | None = None) -> str:
    """The JUnit XML report: one test case per rank, then one for the job."""
    cases: list[tuple[str, str | None, str]] = [
        (f"rank {rank.rank}", rank.problem(), rank.output + ("\n" + rank.stack if rank.stack else ""))
        for rank in outcome.ranks
    ]
    cases.append((f"job: {outcome.job_name}", outcome.failure, result_line(outcome)))
    failures = sum(1 for _, problem, _ in cases if problem)
    seconds = f"{outcome.seconds:.3f}"
    suites = ET.Element("testsuites", name=SUITE, tests=str(len(cases)), failures=str(failures), time=seconds)
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=SUITE,
        tests=str(len(cases)),
        failures=str(failures),
        errors="0",
        skipped="0",
        time=seconds,
        timestamp=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(timestamp if timestamp is not None else time.time())),
    )
    for name, problem, output in cases:
        case = ET.SubElement(suite, "testcase", classname=SUITE, name=name, time=seconds)
        if problem:
            failed = ET.SubElement(
                case, "failure", message=_clean(problem), type="timeout" if outcome.timed_out else "failure"
            )
            failed.text = _clean(output)
        elif output:
            ET.SubElement(case, "system-out").text = _clean(output)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
