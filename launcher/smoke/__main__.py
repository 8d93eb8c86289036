"""The image's `smoke` role (docker/entrypoint.sh):

    smoke [--np N] [--timeout SECONDS] [--junit FILE] [--epochs N] [-- COMMAND ...]

runs COMMAND (by default the bundled trainer, briefly, on the offline digits set, checked) on N ranks in this
container over Gloo, CUDA hidden; prints each rank's output with its rank, then one last line, `smoke: passed: ...`
or `smoke: failed: ...`, and exits with the job's status.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from launcher.agent import stacks
from launcher.smoke import access, hang, leftovers, report, run, shm, trainer

DEFAULT_RANKS = 2
DEFAULT_TIMEOUT_SECONDS = 600.0


@dataclass(frozen=True)
class Options:
    ranks: int
    timeout: float
    junit: Path | None
    epochs: int
    command: tuple[str, ...]


def positive(kind: type):
    def convert(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be more than 0 (got {text})")
        return value

    convert.__name__ = kind.__name__
    return convert


def parse_options(argv: list[str]) -> Options:
    """The options before `--`, the command after it (or, without `--`, from the first word that is no option)."""
    parser = argparse.ArgumentParser(
        prog="smoke", description=(__doc__ or "").split("\n\n")[1].strip().replace("\n", " ")
    )
    parser.add_argument("--np", dest="ranks", type=positive(int), default=DEFAULT_RANKS, help="ranks (default: 2)")
    parser.add_argument(
        "--timeout",
        type=positive(float),
        default=DEFAULT_TIMEOUT_SECONDS,
        help="end every rank after this many seconds, showing each one's Python stack (default: 600)",
    )
    parser.add_argument(
        "--junit", type=Path, help="write a JUnit XML report here (one test case per rank, and the job)"
    )
    parser.add_argument(
        "--epochs",
        type=positive(int),
        default=trainer.EPOCHS,
        help=f"the bundled trainer's epochs, without a command (default: {trainer.EPOCHS})",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command every rank runs, after --")
    if "--" in argv:
        split = argv.index("--")
        options, command = parser.parse_args(argv[:split]), argv[split + 1 :]
    else:
        options = parser.parse_args(argv)
        command = options.command
    return Options(options.ranks, options.timeout, options.junit, options.epochs, tuple(command))


def write_junit(path: Path, outcome: report.Outcome) -> str | None:
    """Writes the report; why it could not, if it could not."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(report.junit_xml(outcome), encoding="utf-8")
    except OSError as error:
        return f"smoke: warning: could not write the JUnit report {path}: {error.strerror or error}"
    return None


def main(argv: list[str]) -> int:
    options = parse_options(argv)
    problem = access.report_problem(options.junit) if options.junit is not None else None
    if problem:
        print(problem, flush=True)
        return 2
    shared_memory = shm.size_bytes()
    leftovers.become_subreaper()
    checkout = Path.cwd()
    special_before = leftovers.with_special_bits(checkout)
    with tempfile.TemporaryDirectory(prefix="smoke-") as folder:
        command = list(options.command) or trainer.command(Path(folder), options.epochs)
        what = shlex.join(options.command) if options.command else f"the bundled trainer ({shlex.join(command)})"
        print(
            f"smoke: {options.ranks} rank{'s' if options.ranks != 1 else ''} over Gloo in this container "
            f"({shlex.join(run.horovodrun_argv(options.ranks, []))}), CUDA hidden, timeout {options.timeout:.0f} s, "
            f"shared memory {shm.shown(shared_memory)}, uid {os.getuid()} in {os.getcwd()}: {what}",
            flush=True,
        )
        try:
            finished = run.run(options.ranks, command, options.timeout)
        except run.Interrupted as interrupted:
            leftovers.tidy(checkout, special_before)
            print(f"smoke: failed: interrupted ({interrupted})", flush=True)
            return 128 + interrupted.number
        # Before anything is judged or written: nothing the ranks started may change the checkout or the report.
        leftovers.tidy(checkout, special_before)
        check, found = None, ""
        if not options.command and finished.returncode == 0 and not finished.timed_out:
            check, found = trainer.verdict(trainer.read_summary(Path(folder)), options.ranks)
    if finished.timed_out:
        print(f"smoke: every rank's Python stack ({finished.how}):", flush=True)
        sys.stdout.write(stacks.report(finished.stacks))
    outcome = report.judge(
        finished.log,
        finished.returncode,
        finished.seconds,
        timeout=options.timeout if finished.timed_out else None,
        where=stacks.summary(finished.stacks) if finished.stacks else "",
        stacks={stack.rank: hang.rank_stack_text(stack) for stack in finished.stacks},
        check=check,
        exits=finished.exits,
        shared_memory=shared_memory,
        environment=(*(f"{name}={value}" for name, value in os.environ.items()), *command),
    )
    if found:
        print(f"smoke: the bundled trainer: {found}", flush=True)
    if options.junit is not None:
        problem = write_junit(options.junit, outcome)
        print(problem or f"smoke: JUnit report in {options.junit}", flush=True)
    print(report.result_line(outcome), flush=True)
    return outcome.status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
