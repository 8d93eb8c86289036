"""Prints a compose job's command line, NUL-separated, for docker/entrypoint.sh's launcher role.

    python -m launcher.job_argv --ranks 2 --hostfile F [--network-interface NIC] [--workdir DIR]
        [--env KEY=VALUE]... [--command-line "python train.py --epochs 5"] [--probe] -- [ARGS...]

mpirun's by default; with --elastic-min-ranks K, horovodrun's elastic one (launcher.plan.horovodrun_argv: --ranks
is then the most ranks, and --slots-per-host, --ssh-port and --elastic-timeout apply).

--command-line (compose's TRAIN_COMMAND) is what every rank runs; without it, ARGS go through job_command, as
after `launcher start --`. The flags themselves come from launcher.plan.mpirun_argv, the multi-host launcher's.
--run-dir gives the bundled trainer its run folder (launcher.plan.with_run_dir).
--probe prints instead the check that a rank can start that command (launcher.plan.command_probe).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from launcher.plan import (ELASTIC_TIMEOUT_SECONDS, command_probe, horovodrun_argv, job_command, mpirun_argv,
                           with_run_dir)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m launcher.job_argv", description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--hostfile", required=True)
    parser.add_argument("--network-interface", default="")
    parser.add_argument("--workdir", default="")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--command-line", default="")
    parser.add_argument("--probe", action="store_true")
    parser.add_argument("--run-dir", default="", help="the bundled trainer's run folder (plan.with_run_dir)")
    parser.add_argument("--elastic-min-ranks", type=int, default=0)
    parser.add_argument("--slots-per-host", type=int, default=1)
    parser.add_argument("--ssh-port", type=int, default=12345)
    parser.add_argument("--elastic-timeout", type=int, default=ELASTIC_TIMEOUT_SECONDS)
    parser.add_argument("--job-id", default="compose")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


def build(argv: list[str]) -> list[str]:
    options = parse(argv)
    command = shlex.split(options.command_line) if options.command_line.strip() else job_command(options.args)
    if options.run_dir:
        command = with_run_dir(command, options.run_dir)
    if options.probe:
        return command_probe(command)
    if options.elastic_min_ranks:
        return horovodrun_argv(min_ranks=options.elastic_min_ranks, max_ranks=options.ranks,
                               slots_per_host=options.slots_per_host,
                               network_interface=options.network_interface or None, ssh_port=options.ssh_port,
                               elastic_timeout=options.elastic_timeout, command=command, job_id=options.job_id,
                               env=tuple(options.env),
                               workdir=options.workdir or None)
    return mpirun_argv(ranks=options.ranks, hostfile=options.hostfile, command=command,
                       network_interface=options.network_interface or None, env=tuple(options.env),
                       workdir=options.workdir or None)


def main() -> None:
    try:
        argv = build(sys.argv[1:])
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    sys.stdout.write("\0".join(argv) + "\0")


if __name__ == "__main__":
    main()
