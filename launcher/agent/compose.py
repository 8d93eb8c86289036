"""Compose's launch: its launcher container's environment (compose.yaml, .env) as a JobSpec for the job agent.

Compose finds its workers by the worker service's DNS name and waits for WORKERS of them; everything after that is the
agent's, as for the multi-host launcher. The job's options are the same JobOptions every launch method builds, their
rules its own; every bad value is refused in one line that names the .env key.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from app.gpu import gpu_rank_env, gpus_asked
from launcher.core.jobspec import JobSpec, LaunchMethodFixes, new_run_id
from launcher.core.options import (
    ENV_NAME,
    JobOptions,
    SettingsError,
    job_command,
    launch_method_names,
    option_kind,
    switch,
)
from launcher.core.protocol import RUNS_DIR, SSH_PORT, WORKDIR
from launcher.core.ranks import COMPOSE, ranks_per_node

DRIVER = "compose's launcher container"
WORDS = LaunchMethodFixes(
    command_fix="set WORKDIR to the folder that holds your code, or use an image FROM horovod-stack:latest that has it",
    workers_fix="check that the workers run (docker compose ps) and that WORKERS matches them",
    lost_hint="`docker compose ps -a` shows how they ended",
)
KEYS = launch_method_names("compose")
"""Compose's .env key for each job option it sets (core/options.py option)."""
SPECIAL = ("command", "env", "elastic", "workdir")
"""Options compose makes of other settings (TRAIN_COMMAND and TRAIN_ARGS, GPUs given and NCCL's verbosity: rank_env,
the elastic minimum's presence, WORKDIR's)."""


def _whole(environ: Mapping[str, str], key: str) -> int | None:
    raw = environ.get(key, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise SettingsError(f"{key}={raw} is not a whole number; fix it in .env")
    return int(raw)


def _count(environ: Mapping[str, str], key: str, default: int) -> int:
    count = _whole(environ, key)
    if count is not None and count < 1:
        raise SettingsError(f"{key}={count} is not a whole number of at least 1; fix it in .env")
    return default if count is None else count


def _worker_service(environ: Mapping[str, str]) -> str:
    return environ.get("WORKER_SERVICE", "").strip() or "worker"


def rank_env(environ: Mapping[str, str]) -> tuple[str, ...]:
    """What compose passes to every rank: where compose.gpu.yaml gave the workers GPUs (GPUS_ASKED), that flag and
    the frameworks' GPU settings (app/gpu.py gpu_rank_env); NCCL's verbosity when set."""
    gpus = gpu_rank_env(()) if gpus_asked(environ) else ()
    return (*gpus, *([f"NCCL_DEBUG={environ['NCCL_DEBUG']}"] if environ.get("NCCL_DEBUG", "").strip() else []))


def job_options(environ: Mapping[str, str], args: list[str], secrets: tuple[str, ...] = ()) -> JobOptions:
    """The job's options from compose's environment: `args` are the service's command words (the bundled trainer's
    flags from compose.yaml), TRAIN_ARGS adds more, TRAIN_COMMAND replaces the trainer with the user's command;
    `secrets`: the names of the launcher service's Compose secrets (secret_names)."""
    user_command = environ.get("TRAIN_COMMAND", "").strip()
    command = (
        shlex.split(user_command) if user_command else job_command([*args, *environ.get("TRAIN_ARGS", "").split()])
    )
    chosen: dict[str, Any] = {}
    for name, key in KEYS.items():
        raw = environ.get(key, "").strip()
        if name not in SPECIAL and raw:
            kind = option_kind(name)
            chosen[name] = _whole(environ, key) if kind in (int, float) else switch(raw, key) if kind is bool else raw
    return JobOptions(
        command=tuple(command),
        env=rank_env(environ),
        elastic="elastic_min_workers" in chosen,
        workdir=WORKDIR if environ.get("WORKDIR", "").strip() else None,
        secrets=secrets,
        launch_method="compose",
        **chosen,
    )


def secret_names(files: list[str]) -> tuple[str, ...]:
    """The secret settings among the files in COMPOSE_SECRETS_DIR: each named like a variable, in name order."""
    return tuple(sorted(name for name in files if ENV_NAME.fullmatch(name)))


def results_hint(environ: Mapping[str, str], run_folder: str | None) -> str | None:
    """Where the run folder is (RESULTS_HINT: the shared volume) and the one command that copies it out, into
    RESULTS_DIR on the host (compose.yaml's default: ./runs); it works once `up` has returned, on the stopped
    launcher container, and scripts/compose-up.sh runs the same copy. `run_folder`: the one the agent makes (the
    bundled trainer's, or Horovod's records for a command of the user's); None: no copy to name."""
    where = environ.get("RESULTS_HINT", "").strip()
    to = environ.get("RESULTS_DIR", "").strip().rstrip("/")
    copy = f"copy it here: docker compose cp launcher:{run_folder} {shlex.quote(to + '/')}" if to and run_folder else ""
    return "; ".join(part for part in (where, copy) if part) or None


def job_spec(environ: Mapping[str, str], args: list[str], secrets: tuple[str, ...] = ()) -> JobSpec:
    """The job that compose's launcher service describes (job_options), run by WORKERS workers of the service, each
    with the ranks core/ranks.py makes of SLOTS_PER_WORKER and GPUS (compose.gpu.yaml's, one rank per GPU)."""
    options = job_options(environ, args, secrets)
    spec = JobSpec(
        job_id=f"compose-{new_run_id()}",
        options=options,
        run_folder=f"{RUNS_DIR}/{environ.get('RUN_ID', '').strip() or new_run_id()}",
        expected_workers=_count(environ, "WORKERS", 2),
        slots=ranks_per_node(_whole(environ, "SLOTS_PER_WORKER"), _whole(environ, "GPUS") or 0, COMPOSE),
        worker_service=_worker_service(environ),
        driver=DRIVER,
        make_key=True,
        words=WORDS,
    )
    return replace(spec, results_hint=results_hint(environ, spec.output_dir))


def fallback_spec(environ: Mapping[str, str]) -> JobSpec:
    """What the agent needs to tell compose's workers that a refused job has ended: where they are."""
    port = environ.get("SSH_PORT", "").strip()
    try:  # the port rule is JobOptions'; a bad one was the refusal, so the workers are on the default
        options = JobOptions(ssh_port=int(port) if port.isdigit() else SSH_PORT, launch_method="compose")
    except SettingsError:
        options = JobOptions(launch_method="compose")
    return JobSpec(
        job_id="refused",
        options=options,
        expected_workers=0,
        worker_service=_worker_service(environ),
        driver=DRIVER,
        make_key=True,
        words=WORDS,
    )
