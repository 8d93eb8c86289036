"""Horovod's own records of a run, through every launch method: `--timeline` and `--autotune` (TIMELINE, AUTOTUNE in
.env and compose) as the ranks' environment, the agent's lines at the job's end, and the readers of both records
(app.timeline, app.autotune), table-driven on events and logs shaped as Horovod 0.28.1 writes them."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from app import autotune, timeline
from launcher.agent.job import Agent
from launcher.core.jobspec import horovod_outputs
from launcher.core.options import JobOptions, SettingsError, switch
from launcher.host.planning.settings import resolve_settings
from tests.conftest import job_spec, plan_of
from tests.standins import Clock, StandInTransport
from tests.test_launcher_plan import compose_spec

RUN = "/shared/runs/c0ffee00"


# --- the options as each launch method spells them, and what the ranks get ---
@pytest.mark.parametrize(
    "timeline_on, autotune_on, folder, user_set, expected",
    [
        (True, False, RUN, frozenset(), [f"HOROVOD_TIMELINE={RUN}/timeline.json"]),
        (False, True, RUN, frozenset(), ["HOROVOD_AUTOTUNE=1", f"HOROVOD_AUTOTUNE_LOG={RUN}/autotune.csv"]),
        (
            True,
            True,
            RUN,
            frozenset({"HOROVOD_TIMELINE"}),
            ["HOROVOD_AUTOTUNE=1", f"HOROVOD_AUTOTUNE_LOG={RUN}/autotune.csv"],
        ),
        (True, True, None, frozenset(), []),
        (False, False, RUN, frozenset(), []),
    ],
)
def test_horovod_outputs_go_into_the_run_folder_unless_the_user_set_them(
    timeline_on, autotune_on, folder, user_set, expected
):
    assert horovod_outputs(timeline_on, autotune_on, folder, user_set) == expected


def test_the_launchers_flags_reach_every_rank_through_mpirun():
    argv = plan_of(timeline=True, autotune=True).job_argv()
    assert ["-x", f"HOROVOD_TIMELINE={RUN}/timeline.json"] == argv[
        argv.index(f"HOROVOD_TIMELINE={RUN}/timeline.json") - 1 :
    ][:2]
    assert f"HOROVOD_AUTOTUNE_LOG={RUN}/autotune.csv" in argv and "HOROVOD_AUTOTUNE=1" in argv
    assert "HOROVOD_TIMELINE" not in " ".join(plan_of().job_argv())


def test_a_users_command_gets_the_run_folder_for_the_records_alone():
    spec = plan_of(command=("python", "train.py"), timeline=True).job_spec()
    assert spec.run_dir is None and spec.output_dir == RUN
    assert f"HOROVOD_TIMELINE={RUN}/timeline.json" in spec.job_argv()
    assert plan_of(command=("python", "train.py")).job_spec().output_dir is None


@pytest.mark.parametrize(
    "env, flags, expected",
    [
        ({}, {}, (False, False)),
        ({"TIMELINE": "1", "AUTOTUNE": "yes"}, {}, (True, True)),
        ({"TIMELINE": "0", "AUTOTUNE": "off"}, {"timeline": True}, (True, False)),  # the flag wins
        (
            {"TIMELINE": "maybe"},
            {},
            (
                "TIMELINE='maybe' in the .env file is not 1 or 0 (true or false): fix it or pass --timeline",
                "TIMELINE=maybe is neither 1 (on) nor 0 (off); fix it in .env",
            ),
        ),
    ],
)
def test_timeline_and_autotune_come_from_the_flags_or_the_env_file_and_compose(env, flags, expected):
    if isinstance(expected[0], str):  # each launch method's own words: the launcher's .env, compose's
        with pytest.raises(SettingsError, match=re.escape(expected[0])):
            resolve_settings({"NODES": "a", **env}, job=flags)
        with pytest.raises(SettingsError, match=re.escape(expected[1])):
            compose_spec(**env)
        return
    job = resolve_settings({"NODES": "a", **env}, job=flags).job
    assert (job.timeline, job.autotune) == expected
    options = compose_spec(**env).options
    assert (options.timeline, options.autotune) == (env.get("TIMELINE") == "1", env.get("AUTOTUNE") == "yes")


def test_compose_passes_timeline_to_every_rank_into_its_run_folder():
    spec = compose_spec(TIMELINE="1", RUN_ID="r1")
    assert "HOROVOD_TIMELINE=/shared/runs/r1/timeline.json" in spec.job_argv()


@pytest.mark.parametrize("text, value", [("1", True), ("TRUE", True), (" on ", True), ("no", False), ("0", False)])
def test_switch_words(text, value):
    assert switch(text, "K") is value


def test_start_has_the_flags():
    from launcher.cli import app

    result = CliRunner().invoke(app, ["start", "--help"], env={"COLUMNS": "200"})
    assert "--timeline" in result.output and "--autotune" in result.output
    assert JobOptions(timeline=True).option_names.of("timeline") == "--timeline"


# --- the timeline ---
def allreduce(pid: int, start: int, fused_end: int, shape: str, dtype: str = "HOROVOD_FLOAT32") -> list[dict]:
    """One tensor's negotiation (both ranks ready) and its allreduce, as Horovod writes them."""
    return [
        {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": start, "pid": pid},
        {"ph": "X", "name": "0", "ts": start + 1, "pid": pid, "dur": 0},
        {"ph": "X", "name": "1", "ts": start + 5, "pid": pid, "dur": 0},
        {"ph": "E", "ts": start + 5, "pid": pid},
        {"ph": "B", "name": "ALLREDUCE", "ts": start + 10, "pid": pid},
        {"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": start + 11, "pid": pid},
        {"ph": "E", "ts": start + 12, "pid": pid},
        {"ph": "B", "name": "MPI_ALLREDUCE", "ts": start + 13 + pid % 2, "pid": pid},  # fused: starts a tick apart
        {"ph": "E", "ts": fused_end, "pid": pid},
        {"ph": "E", "ts": fused_end + 2, "pid": pid, "args": {"dtype": dtype, "shape": shape}},
    ]


def two_steps() -> list[dict]:
    """Two steps of three gradients: the first two fused (1000 floats + 250 floats), the third alone."""
    events = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"allreduce.t{pid}"}} for pid in (1, 2, 3)
    ]
    events += [
        {"name": "process_name", "ph": "M", "pid": 4, "args": {"name": "broadcast.w"}},
        {"ph": "B", "name": "NEGOTIATE_BROADCAST", "ts": 1, "pid": 4},
        {"ph": "E", "ts": 2, "pid": 4},
        {"ph": "B", "name": "BROADCAST", "ts": 3, "pid": 4},
        {"ph": "B", "name": "MPI_BCAST", "ts": 4, "pid": 4},
        {"ph": "E", "ts": 5, "pid": 4},
        {"ph": "E", "ts": 6, "pid": 4},
    ]
    for step in (1000, 2000):
        events += allreduce(1, step, step + 100, "[10, 100]") + allreduce(2, step, step + 101, "[250]")
        events += allreduce(3, step + 200, step + 300, "[2, 2]", "HOROVOD_FLOAT16")
    return events


def test_the_timeline_summary_counts_negotiations_data_and_fused_collectives_per_step():
    summary = timeline.summarize(two_steps())
    assert (summary.tensors, summary.steps, summary.negotiations, summary.data_operations) == (3, 2, 6, 6)
    assert summary.collectives == [0.005, 8e-06, 0.005, 8e-06] and summary.ranks == [0, 1]
    assert summary.line() == (
        "3 tensors, allreduced over 2 steps; per step 3.0 negotiations and 3.0 data operations "
        "in 2.0 collectives; fused sizes 8e-06-0.005 MB (median 0.0025 MB); ranks in the "
        "negotiations: 0,1"
    )


@pytest.mark.parametrize(
    "args, size",
    [
        ({"dtype": "HOROVOD_FLOAT32", "shape": "[64, 3, 7, 7]"}, 64 * 3 * 49 * 4),
        ({"dtype": "HOROVOD_FLOAT16", "shape": "[10]"}, 20),
        ({"dtype": "HOROVOD_FLOAT64", "shape": "[]"}, 8),
        ({}, 0),
    ],
)
def test_tensor_bytes(args, size):
    assert timeline.tensor_bytes(args) == size


def test_a_timeline_cut_short_is_read_to_its_last_complete_event():
    text = json.dumps(two_steps())[:-1]
    cut = text[: text.rfind("{") + 5]  # a killed job: half an event, no closing bracket
    assert len(timeline.parse(cut)) == len(two_steps()) - 1
    assert timeline.summarize([]).line() == "0 tensors, no complete data operation recorded"


# --- autotune ---
HEADER = (
    "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,cycle_time_ms,"
    "tensor_fusion_threshold,score\n"
)
SAMPLES = "0,0,0, 0,5,4,1.5724\n0,0,0, 0,50,32,0.485476\n0,0,0, 0,25,16,2.771915\n"


@pytest.mark.parametrize(
    "log, record, words",
    [
        (
            HEADER + SAMPLES,
            {
                "finished": False,
                "samples": 3,
                "chosen": {
                    "cycle_time_ms": 25.0,
                    "fusion_threshold_mb": 16.0,
                    "hierarchical_allreduce": False,
                    "hierarchical_allgather": False,
                    "torus_allreduce": False,
                    "cache_enabled": False,
                },
                "score_mb_per_s": 2.771915,
            },
            "autotune: not finished after 3 samples (the job ended first); best so far: cycle 25 ms, fusion 16 MB, "
            "hierarchical allreduce off, hierarchical allgather off, torus allreduce off, cache enabled off (2.772 "
            "MB/s)",
        ),
        (
            HEADER + SAMPLES + "0,0,0, 1,25,16,2.771915\n",
            {
                "finished": True,
                "samples": 3,
                "chosen": {
                    "cycle_time_ms": 25.0,
                    "fusion_threshold_mb": 16.0,
                    "hierarchical_allreduce": False,
                    "hierarchical_allgather": False,
                    "torus_allreduce": False,
                    "cache_enabled": True,
                },
                "score_mb_per_s": 2.771915,
            },
            "autotune: chose cycle 25 ms, fusion 16 MB, hierarchical allreduce off, hierarchical allgather off, torus "
            "allreduce off, cache enabled on (best of 3 samples, 2.772 MB/s)",
        ),
        (HEADER, {"samples": 0, "finished": False}, "autotune: no sample scored (the job ended before the first one"),
        ("", {"samples": 0, "finished": False}, "autotune: no sample scored"),
    ],
)
def test_the_autotune_log_as_a_record_and_a_line(log, record, words):
    assert autotune.read_log(log) == record
    assert autotune.line(record).startswith(words)


# --- the agent's lines at the job's end ---
W = ("10.0.0.1", "10.0.0.2")


def finished_job(files: dict[str, str], **options) -> tuple[list[str], StandInTransport]:
    from launcher.core.jobspec import Worker

    clock = Clock()
    transport = StandInTransport(clock)
    transport.files.update(files)
    spec = job_spec(
        command=("python", "t.py"),
        workers=tuple(Worker(f"node_{i}", a) for i, a in enumerate(W, 1)),
        run_folder=RUN,
        ready_timeout=5,
        **options,
    )
    said: list[str] = []
    Agent(spec, transport, say=said.append, clock=clock, sleep=clock.sleep).run()
    return said, transport


def test_the_agent_makes_the_run_folder_and_summarises_the_timeline_and_the_autotune_choice():
    said, transport = finished_job(
        {f"{RUN}/timeline.json": json.dumps(two_steps()), f"{RUN}/autotune.csv": HEADER + SAMPLES},
        timeline=True,
        autotune=True,
    )
    assert transport.run_dirs == [RUN]
    assert (
        f"timeline: {RUN}/timeline.json: 3 tensors, allreduced over 2 steps; per step 3.0 negotiations and 3.0 "
        "data operations in 2.0 collectives; fused sizes 8e-06-0.005 MB (median 0.0025 MB); ranks in the "
        "negotiations: 0,1; open it in https://ui.perfetto.dev or chrome://tracing"
    ) in said
    assert any(
        line.startswith("autotune: not finished after 3 samples") and line.endswith(f"{RUN}/autotune.json")
        for line in said
    )
    assert json.loads(transport.files[f"{RUN}/autotune.json"])["chosen"]["cycle_time_ms"] == 25.0
    assert f"results: {RUN} (Horovod's records)" in said


def test_the_agent_says_when_rank_0_wrote_no_timeline():
    said, _ = finished_job({}, timeline=True)
    assert f"timeline: rank 0 wrote no {RUN}/timeline.json (the job ended before Horovod started)" in said
    assert not any(line.startswith("autotune") for line in said)
