"""`launcher start`'s flags as one table (launcher/host/planning/flags.py FLAGS, the job's rows from JobOptions'
option() metadata): --help lists each row once with its default and .env key, each flag reaches its setting, and each
row's .env key sets the same thing as its flag.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher import cli
from launcher.cli import app
from launcher.core.options import JobOptions
from launcher.host.planning import flags
from launcher.host.planning.plan import ClusterPlan
from launcher.host.planning.settings import LaunchSettings, resolve_settings

SAMPLES: dict[str, tuple[str, Any, Callable[[LaunchSettings], Any]]] = {
    "nodes": ("x,y", ("x", "y"), lambda s: s.nodes),
    "slots": ("3", 3, lambda s: s.slots),
    "gpus": ("2", 2, lambda s: s.gpus_per_node),
    "image": ("registry.example.com/stack:2", "registry.example.com/stack:2", lambda s: s.image),
    "spares": ("c", ("c",), lambda s: s.spares),
    "device": ("/dev/infiniband", ("/dev/infiniband",), lambda s: s.devices),
    "secret": ("TOKEN", ("TOKEN",), lambda s: s.job.secrets),
    "network_interface": ("eth1", "eth1", lambda s: s.job.network_interface),
    "ssh_port": ("2222", 2222, lambda s: s.job.ssh_port),
    "stall_timeout": ("30", 30, lambda s: s.job.stall_timeout),
    "stall_action": ("fail", "fail", lambda s: s.job.stall_action),
    "time_limit": ("600", 600, lambda s: s.job.time_limit),
    "elastic_timeout": ("90", 90, lambda s: s.job.elastic_timeout),
    "worker_restarts": ("2", 2, lambda s: s.job.worker_restarts),
    "max_restarts": ("2", 2, lambda s: s.job.max_restarts),
    "mount": ("/data:/data:ro", ("/data:/data:ro",), lambda s: s.job.mounts),
    "min_nodes": ("1", 1, lambda s: s.job.elastic_min_workers),
    "max_nodes": ("2", 2, lambda s: s.job.elastic_max_workers),
    "workdir": (".", ".", lambda s: s.job.workdir),
    "ranks": ("1", frozenset({1}), lambda s: s.shown_ranks),
}
"""For each row with a value: a value as typed, what it becomes, and where the settings hold it."""
SWITCHES: dict[str, Callable[[LaunchSettings], Any]] = {
    "insecure_engine": lambda s: s.insecure_engines,
    "no_ptrace": lambda s: not s.job.ptrace,
    "timeline": lambda s: s.job.timeline,
    "autotune": lambda s: s.job.autotune,
    "elastic": lambda s: s.job.elastic,
    "restart_workers": lambda s: s.job.restart_workers,
    "push_image": lambda s: s.push_image,
    "detach": lambda s: s.detach,
    "keep_running": lambda s: s.keep_running,
    "debug": lambda s: "NCCL_DEBUG=INFO" in s.job.env,
}
"""For each switch that reaches the settings: where they show it on."""
NEEDS = {
    "spares": ["--max-restarts", "1"],
    "elastic_timeout": ["--elastic", "--network-interface", "eth0"],
    "elastic": ["--network-interface", "eth0"],
    "min_nodes": ["--elastic", "--network-interface", "eth0"],
    "max_nodes": ["--elastic", "--network-interface", "eth0"],
    "restart_workers": ["--elastic", "--network-interface", "eth0"],
    "worker_restarts": ["--elastic", "--network-interface", "eth0", "--restart-workers"],
    "keep_running": ["--detach"],
}
"""What a row needs beside it to be a valid start (the rules of JobOptions and LaunchSettings)."""
ENGINES = {"DOCKER_HOST_X": "tcp://10.9.9.9:2375", "DOCKER_HOST_Y": "tcp://10.9.9.8:2375"}
"""Engines others could read: --insecure-engine and INSECURE_ENGINES have something to allow."""


@pytest.fixture
def reached(monkeypatch, tmp_path) -> list[LaunchSettings]:
    """The settings `launcher start --dry-run` hands on (launch.dry_run), in a folder without a .env."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TOKEN", "t0ken")
    for key, value in ENGINES.items():
        monkeypatch.setenv(key, value)
    calls: list[LaunchSettings] = []
    monkeypatch.setattr(cli.launch, "dry_run", lambda settings, **_: calls.append(settings))
    return calls


def start(reached: list[LaunchSettings], *args: str) -> LaunchSettings:
    nodes = [] if "--nodes" in args else ["--nodes", "x,y"]
    result = CliRunner().invoke(app, ["start", "--dry-run", "--insecure-engine", *nodes, *args])
    assert result.exit_code == 0, result.output
    return reached.pop()


def help_lines() -> list[str]:
    """start --help, one line per flag (wide enough that no help wraps)."""
    output = CliRunner().invoke(app, ["start", "--help"], env={"COLUMNS": "1000"}).output
    return [line.strip("│ ") for line in output.splitlines()]


@pytest.mark.parametrize("row", flags.FLAGS, ids=lambda row: row.name)
def test_help_lists_each_flag_once_with_its_default_and_env_key(row):
    lines = [line for line in help_lines() if line.split(" ", 1)[0].split(",")[0] == row.flag]
    assert len(lines) == 1, lines
    assert row.help.removesuffix(".") in lines[0]
    for part in (row.key and f"{row.key} in .env", row.shown):
        assert not part or "default: " in lines[0] and part in lines[0], lines[0]


def test_the_flags_are_the_rows_and_every_row_goes_somewhere_real():
    written = [line.split(" ", 1)[0].split(",")[0] for line in help_lines() if line.startswith("--")]
    assert written == [row.flag for row in flags.FLAGS] + ["--help"]
    keywords = set(inspect.signature(resolve_settings).parameters)
    options = {item.name for item in fields(JobOptions)}
    for row in flags.FLAGS:
        where = row.to or ""
        assert where in keywords or where.removeprefix(flags.JOB) in options or row.name in ("env_file", "debug",
               "dry_run"), row  # fmt: skip
    flagged = [item.name for item in fields(JobOptions) if item.metadata.get("flag")]
    assert [row.to for row in flags.FLAGS if row.to and row.to.startswith(flags.JOB)] == [
        flags.JOB + name for name in flagged
    ]
    assert all(item.metadata.get("help") for item in fields(JobOptions) if item.metadata.get("flag"))


TESTED_ELSEWHERE = ("hostfile", "env")
"""--hostfile takes a file of its own (tests/test_launcher_plan.py); --env reaches every rank in
test_env_and_debug_reach_every_rank."""


@pytest.mark.parametrize(
    "name", [row.name for row in flags.FLAGS if row.kind is not bool and row.to and row.name not in TESTED_ELSEWHERE]
)
def test_each_flag_reaches_its_setting(reached, name):
    typed, value, where = SAMPLES[name]
    assert where(start(reached, *NEEDS.get(name, []), flags.ROWS[name].flag, typed)) == value


@pytest.mark.parametrize("name", [row.name for row in flags.FLAGS if row.kind is bool and row.to] + ["debug"])
def test_each_switch_reaches_its_setting_only_when_given(reached, name):
    where = SWITCHES[name]
    assert where(start(reached, *NEEDS.get(name, []), flags.ROWS[name].flag))
    if name != "insecure_engine":  # start() gives it always, for the engines of ENGINES
        assert not where(start(reached, *NEEDS.get(name, [])))


@pytest.mark.parametrize("row", [row for row in flags.FLAGS if row.key], ids=lambda row: row.name)
def test_each_env_key_sets_what_its_flag_sets(reached, tmp_path, row):
    env_file = tmp_path / "flags.env"
    if row.kind is bool:
        env_file.write_text(f"{row.key}={'0' if row.name.startswith('no_') else '1'}\n")
        where = SWITCHES[row.name]
        assert where(start(reached, *NEEDS.get(row.name, []), "--env-file", str(env_file)))
        return
    typed, value, where = SAMPLES[row.name]
    env_file.write_text(f"{row.key}={typed}\n")
    assert where(start(reached, *NEEDS.get(row.name, []), "--env-file", str(env_file))) == value


def test_env_and_debug_reach_every_rank(reached):
    settings = start(reached, "--env", "A=1", "--env", "B=2", "--debug")
    assert settings.job.env == ("A=1", "B=2", "NCCL_DEBUG=INFO")


def test_elastic_timeout_reaches_horovodrun():
    """The flag added as one row: --elastic-timeout is horovodrun's own."""
    settings = resolve_settings(
        {"NODES": "a,b"},
        **flags.start_settings({"elastic": True, "network_interface": "eth0", "elastic_timeout": 90}, ()),  # fmt: skip
    )
    argv = ClusterPlan.of(settings, "c1").job_argv()
    assert argv[argv.index("--elastic-timeout") + 1] == "90"
    bad = CliRunner().invoke(app, ["start", "--dry-run", "--nodes", "a,b", "--elastic", "--network-interface", "eth0",
                                   "--elastic-timeout", "0"])  # fmt: skip
    assert bad.exit_code == 2 and "error: --elastic-timeout 0 is not positive seconds" in bad.output, bad.output


def test_the_insecure_engines_key_is_the_one_the_engines_access_reads():
    from launcher.host.planning import access

    assert flags.INSECURE.key == access.INSECURE_ENGINES
