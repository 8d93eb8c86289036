"""Compose's door: its launcher container's environment (compose.yaml, .env) as a JobSpec for the job agent.

Compose finds its workers by the worker service's DNS name and waits for WORKERS of them; everything after that
is the agent's, as for the multi-host launcher. Every bad value is refused in one line that names the .env key.
"""

from __future__ import annotations

import dataclasses
import secrets
import shlex
import time
from collections.abc import Mapping

from app.gpu import GPUS_ASKED
from launcher.plan import RUNS_DIR, WORKDIR, DoorWords, JobSpec, job_command, with_run_dir
from launcher.protocol import ELASTIC_TIMEOUT_SECONDS, READY_TIMEOUT_SECONDS, SSH_PORT, STALL_TIMEOUT_SECONDS
from launcher.stall import STALL_ACTIONS

WORDS = DoorWords(
    command_fix="set WORKDIR to the folder that holds your code, or use an image FROM horovod-stack:latest that has it",
    workers_fix="check that the workers run (docker compose ps) and that WORKERS matches them",
    elastic_minimum="ELASTIC_MIN_WORKERS",
    lost_hint="`docker compose ps -a` shows how they ended",
)


class SpecError(ValueError):
    """A compose setting the agent refuses; one line naming the key and the fix."""


def _whole(environ: Mapping[str, str], key: str, default: int, low: int = 1, high: int | None = None) -> int:
    raw = environ.get(key, "").strip()
    if not raw:
        return default
    bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
    if not raw.isdigit() or int(raw) < low or (high is not None and int(raw) > high):
        raise SpecError(f"{key}={raw} is not a whole number {bound}; fix it in .env")
    return int(raw)


def _choice(environ: Mapping[str, str], key: str, choices: tuple[str, ...]) -> str:
    raw = environ.get(key, "").strip() or choices[0]
    if raw not in choices:
        raise SpecError(f"{key}={raw} is not one of {', '.join(choices)}; fix it in .env")
    return raw


def _worker_service(environ: Mapping[str, str]) -> str:
    return environ.get("WORKER_SERVICE", "").strip() or "worker"


def new_run_id(now: float | None = None) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + "-" + secrets.token_hex(2)


def job_spec(environ: Mapping[str, str], args: list[str]) -> JobSpec:
    """The job that compose's launcher service describes: `args` are the service's command words (the bundled
    trainer's flags from compose.yaml), TRAIN_ARGS adds more, TRAIN_COMMAND replaces the trainer with the user's
    command."""
    workers = _whole(environ, "WORKERS", 2)
    slots = _whole(environ, "SLOTS_PER_WORKER", 1)
    ssh_port = _whole(environ, "SSH_PORT", SSH_PORT, high=65535)
    minimum = environ.get("ELASTIC_MIN_WORKERS", "").strip()
    if minimum and (not minimum.isdigit() or not 1 <= int(minimum) <= workers):
        raise SpecError(
            f"ELASTIC_MIN_WORKERS={minimum} is not a whole number from 1 to WORKERS ({workers}); fix it "
            "in .env, or leave it empty for a fixed-size job"
        )
    user_command = environ.get("TRAIN_COMMAND", "").strip()
    if user_command:
        command = shlex.split(user_command)
    else:
        command = job_command([*args, *environ.get("TRAIN_ARGS", "").split()])
        command = with_run_dir(command, f"{RUNS_DIR}/{environ.get('RUN_ID', '').strip() or new_run_id()}")
    # Passed to every rank when compose sets them: GPUs given (compose.gpu.yaml) and NCCL's verbosity.
    env = tuple(f"{key}={environ[key]}" for key in (GPUS_ASKED, "NCCL_DEBUG") if environ.get(key, "").strip())
    return JobSpec(
        job_id=f"compose-{new_run_id()}",
        env=env,
        command=tuple(command),
        expected_workers=workers,
        slots=slots,
        worker_service=_worker_service(environ),
        ssh_port=ssh_port,
        network_interface=environ.get("NETWORK_INTERFACE", "").strip() or None,
        workdir=WORKDIR if environ.get("WORKDIR", "").strip() else None,
        elastic_min_workers=int(minimum) if minimum else None,
        elastic_timeout=_whole(environ, "ELASTIC_TIMEOUT", ELASTIC_TIMEOUT_SECONDS),
        ready_timeout=_whole(environ, "READY_TIMEOUT", READY_TIMEOUT_SECONDS),
        stall_timeout=_whole(environ, "STALL_TIMEOUT", STALL_TIMEOUT_SECONDS, low=0),
        stall_action=_choice(environ, "STALL_ACTION", STALL_ACTIONS),
        driver="compose's launcher container",
        make_key=True,
        results_hint=environ.get("RESULTS_HINT", "").strip() or None,
        words=dataclasses.replace(WORDS, elastic_minimum=f"ELASTIC_MIN_WORKERS={minimum}"),
    )


def fallback_spec(environ: Mapping[str, str]) -> JobSpec:
    """What the agent needs to tell compose's workers that a refused job has ended: where they are."""
    port = environ.get("SSH_PORT", "").strip()
    return JobSpec(
        job_id="refused",
        command=(),
        expected_workers=0,
        worker_service=_worker_service(environ),
        ssh_port=int(port) if port.isdigit() else SSH_PORT,
        driver="compose's launcher container",
        make_key=True,
        words=WORDS,
    )
