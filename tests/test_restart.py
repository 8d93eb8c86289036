"""Restarting a fixed-size job that lost a node (--max-restarts): the pure decisions of launcher/core/restart.py as
tables, the options' rules, the job spec of a restart, and the agent doing it all against the stand-in transport."""

from __future__ import annotations

import json

import pytest

from launcher.agent.job import Agent
from launcher.agent.restarter import LEFTOVERS
from launcher.core import restart
from launcher.core.jobend import JobEnd, parse_job_end
from launcher.core.jobspec import JobSpec, Worker
from launcher.core.options import OPTION_NAMES, JobOptions, SettingsError
from launcher.core.protocol import CHECKPOINT_DIR_VARIABLE, JOB_STATUS, RESTART_VARIABLE
from launcher.core.restart import NotRestarted, Why
from launcher.core.runs import LostWorker, RunResult, RunState
from launcher.host.engines.node_engine import ContainerState
from launcher.host.running import jobstate
from tests.conftest import job_spec, launch_settings
from tests.standins import Clock
from tests.standins import StandInTransport as Transport

W1, W2, W3 = Worker("node_1", "10.0.0.1"), Worker("node_2", "10.0.0.2"), Worker("node_3", "10.0.0.3")
LAUNCHER = OPTION_NAMES["launcher"]
RUN = "/shared/runs/c0ffee00"


# --- the decisions --------------------------------------------------------------------------------------------
def refusal(**given) -> NotRestarted | None:
    """restart.refusal for a run of `status` that lost `lost`, after `restarts` restarts for lost nodes and
    `script_restarts` for the script's own failure."""
    facts = {"status": 1, "lost": ["node_2"], "state": None, "restarts": 0, "script_restarts": 0, **given}
    lost = tuple(LostWorker(name, silent=False) for name in facts["lost"])
    state = facts["state"] or (
        RunState.SUCCEEDED if facts["status"] == 0 else RunState.WORKERS_LOST if lost else RunState.FAILED
    )
    history = [
        restart.Restart(
            number, 9, "x", ("node_1",), after=RunState.FAILED if number <= facts["script_restarts"] else state
        )
        for number in range(1, facts["restarts"] + facts["script_restarts"] + 1)
    ]
    return restart.refusal(
        RunResult(state, facts["status"], lost=lost),
        stop_asked=given.get("stop_asked", False),
        history=history,
        max_restarts=given.get("max_restarts", 3),
        say=given.get("say", LAUNCHER),
    )


@pytest.mark.parametrize(
    "given, why, reason",
    [
        ({}, None, None),
        ({"lost": []}, None, None),  # the script's own failure: once
        (
            {"lost": [], "script_restarts": 1},
            Why.SCRIPT_FAILED_AGAIN,
            "not restarted: the script itself failed again (exit status 1) with no node lost, so another restart would "
            "fail the same way; the error is in the job's log above (restarts are for lost nodes)",
        ),
        ({"script_restarts": 1}, None, None),  # a lost node is restarted however often the script failed before
        (
            {"restarts": 3},
            Why.USED_UP,
            "not restarted: all 3 restart(s) (--max-restarts 3) are used up; allow more with a larger --max-restarts",
        ),
        ({"status": 0}, Why.SUCCEEDED, ""),
        ({"max_restarts": 0}, Why.RESTARTS_OFF, ""),  # restarts off: nothing to say
        (
            {"state": RunState.TIMED_OUT, "status": 124},
            Why.ENDED_BY_WATCH,
            "not restarted: its time limit ended it, not a lost node",
        ),
        (
            {"state": RunState.STALLED},
            Why.ENDED_BY_WATCH,
            "not restarted: the stall watch (stall action fail) ended it, not a lost node",
        ),
        ({"stop_asked": True}, Why.STOP_ASKED, "not restarted: the job was told to stop (exit status 1)"),
        ({"lost": [], "status": 143}, Why.STOP_ASKED, "not restarted: the job was told to stop (exit status 143)"),
        ({"status": 143}, None, None),  # mpirun ended by the agent because node_2 was lost
    ],
)
def test_which_failures_are_restarted(given, why, reason):
    refused = refusal(**given)
    assert (refused.why, refused.reason) == (why, reason) if refused else (why, reason) == (None, None)


@pytest.mark.parametrize(
    "run, spares, back, min_workers, expected",
    [
        (
            RunResult(RunState.WORKERS_LOST, 137, lost=(LostWorker("node_2", silent=True),)),
            ["node_4"],
            [],
            None,
            restart.Restart(1, 3, "node_2 went silent", ("node_1", "node_4", "node_3"), 5, "/ck"),
        ),
        (
            RunResult(RunState.WORKERS_LOST, 137, lost=(LostWorker("node_2", silent=False),)),
            [],
            [],
            2,
            restart.Restart(1, 3, "node_2's worker was lost", ("node_1", "node_3"), 5, "/ck"),
        ),
        (
            RunResult(RunState.FAILED, 1),
            [],
            [],
            None,
            restart.Restart(
                1, 3, "the script failed (exit status 1)", ("node_1", "node_2", "node_3"), 5, "/ck", RunState.FAILED
            ),
        ),
        (
            RunResult(RunState.WORKERS_LOST, 137, lost=(LostWorker("node_2", silent=False),)),
            [],
            [],
            3,
            NotRestarted(Why.TOO_FEW_LEFT, "not restarted: 2 worker(s) remain, fewer than --min-nodes 3"),
        ),
        (RunResult(RunState.SUCCEEDED, 0), [], [], None, NotRestarted(Why.SUCCEEDED)),
    ],
)
def test_the_restart_decision_is_a_record_with_its_reason(run, spares, back, min_workers, expected):
    decided = restart.decide(
        run,
        stop_asked=False,
        history=[],
        max_restarts=3,
        workers=["node_1", "node_2", "node_3"],
        spares=spares,
        back=back,
        min_workers=min_workers,
        resume=(5, "/ck"),
        say=LAUNCHER,
    )
    assert decided == expected


def test_compose_names_its_own_setting():
    refused = refusal(restarts=1, max_restarts=1, say=OPTION_NAMES["compose"])
    assert refused and "(MAX_RESTARTS=1)" in refused.reason


@pytest.mark.parametrize(
    "workers, lost, minimum, wait",
    [
        (3, 1, None, True),  # the whole world or nothing: wait for it
        (3, 1, 2, False),  # allowed to go on with 2
        (3, 2, 2, True),
        (3, 0, None, False),  # the script's own failure: nobody to wait for
    ],
)
def test_the_agent_waits_for_a_lost_worker_only_when_the_rest_may_not_go_on(workers, lost, minimum, wait):
    assert restart.must_wait(workers, lost, minimum) is wait


@pytest.mark.parametrize(
    "lost, back, minimum, expected",
    [
        ([], [], None, ["node_1", "node_2", "node_3"]),
        (["node_2"], ["node_2"], None, ["node_1", "node_2", "node_3"]),
        (["node_2"], [], 2, ["node_1", "node_3"]),
        (
            ["node_2"],
            [],
            None,
            NotRestarted(
                Why.LOST_DID_NOT_RETURN,
                "not restarted: node_2 did not answer again within 30 s and the job may not run on "
                "fewer nodes: pass --min-nodes 2 to let it go on without it",
            ),
        ),
        (
            ["node_2", "node_3"],
            [],
            2,
            NotRestarted(Why.TOO_FEW_LEFT, "not restarted: 1 worker(s) remain, fewer than --min-nodes 2"),
        ),
        (["node_2", "node_3"], ["node_3"], 2, ["node_1", "node_3"]),
    ],
)
def test_the_world_of_a_restart(lost, back, minimum, expected):
    assert restart.world_after(["node_1", "node_2", "node_3"], lost, back, minimum, LAUNCHER) == expected


@pytest.mark.parametrize(
    "done, line",
    [
        (
            restart.Restart(1, 3, "node_2 went silent", ("node_1", "node_3"), 7, f"{RUN}/checkpoints"),
            "restart 1/3: node_2 went silent; resuming after epoch 7 on node_1,node_3",
        ),
        (
            restart.Restart(2, 2, "the script failed (exit status 1)", ("node_1",), None, "/shared/ck"),
            "restart 2/2: the script failed (exit status 1); resuming from the newest checkpoint in /shared/ck on "
            "node_1",
        ),
        (
            restart.Restart(1, 1, "node_2's worker was lost", ("node_1",)),
            "restart 1/1: node_2's worker was lost; starting over on node_1",
        ),
    ],
)
def test_each_restart_is_one_line(done, line):
    assert done.line() == line
    assert json.loads(done.record())["workers"] == list(done.workers)


@pytest.mark.parametrize(
    "metrics, epoch",
    [
        (None, None),
        ("", None),
        ('{"epoch": 1}\n{"epoch": 2}\n{"epo', 2),  # a line cut short by the kill
    ],
)
def test_the_last_checkpointed_epoch_is_the_metrics_last(metrics, epoch):
    assert restart.metrics_epoch(metrics) == epoch


FIRST = restart.Restart(1, 2, "node_2 went silent", ("node_1",))
SECOND = restart.Restart(2, 2, "node_3's worker was lost", ("node_1",), resume_epoch=1)


def test_status_shows_the_last_restart_from_the_agents_records_not_from_its_words():
    assert restart.last_restart(FIRST.record() + SECOND.record()) == (
        "restart 2/2: node_3's worker was lost; resuming after epoch 1 on node_1"
    )
    assert restart.last_restart(FIRST.record() + '{"number": 2, "of": 2, "rea') == FIRST.line()  # being written
    assert restart.last_restart(None) is None


def test_status_of_a_running_job_names_its_last_restart():
    log = "restart 9/9: the user's own words\n"  # a rank's words are not the agent's records
    state = jobstate.describe(ContainerState("rank0", True), None, [], metrics=log, restarts_made=FIRST.record())
    assert state.endswith("; restart 1/2: node_2 went silent; starting over on node_1")
    assert jobstate.describe(ContainerState("rank0", True), None, [], metrics=log) == "running: no epoch finished yet"


def test_status_of_an_ended_job_reads_its_restarts_and_why_not_more_from_the_end_record():
    end = JobEnd(
        137,
        "node_2: worker lost during the run",
        lost=("node_2",),
        restarts=(FIRST,),
        not_restarted=NotRestarted(Why.USED_UP, "not restarted: all 1 restart(s) (--max-restarts 1) are used up"),
    )
    state = jobstate.describe(ContainerState("rank0", False, 137), end.to_json(), [])
    assert state == (
        "failed (exit status 137): node_2: worker lost during the run; not restarted: all 1 restart(s) "
        "(--max-restarts 1) are used up; restart 1/2: node_2 went silent; starting over on node_1"
    )


@pytest.mark.parametrize(
    "restart_workers, most, holds_driver, restarts, policy",
    [
        (True, 2, False, 2, {"Name": "on-failure", "MaximumRetryCount": 2}),
        (True, 2, True, 0, None),  # rank 0's worker holds the agent and the driver: its end is the job's
        (False, 2, False, 0, None),  # --restart-workers off
        (True, 0, False, 0, None),
    ],
)
def test_which_workers_their_engine_starts_again_after_they_failed(
    restart_workers, most, holds_driver, restarts, policy
):
    assert restart.worker_restarts(restart_workers, most, holds_driver) == restarts
    assert restart.worker_restart_policy(restarts) == policy


# --- the options ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"max_restarts": -1}, "--max-restarts -1 is neither 0 (off) nor a positive count"),
        (
            {"max_restarts": 2, "elastic": True, "network_interface": "eth0"},
            "--max-restarts 2 is for fixed-size jobs: an elastic job goes on without a lost node by itself; drop "
            "--max-restarts, or drop --elastic to have a fixed-size job restarted",
        ),
        (
            {"elastic_min_workers": 2, "elastic": False},
            "--min-nodes is for elastic jobs: add --elastic (or --max-restarts N: a fixed-size job restarted on fewer "
            "nodes)",
        ),
        ({"max_restarts": 1, "elastic_min_workers": 0, "elastic": False}, "--min-nodes 0 is not 1 or more"),
        (
            {"max_restarts": 1, "elastic_min_workers": 4, "elastic": False},
            "--min-nodes 4 is not from 1 to the 3 node(s) in --nodes",
        ),
    ],
)
def test_bad_restart_settings_are_refused(overrides, message):
    with pytest.raises(SettingsError) as error:
        launch_settings(**{"nodes": ("a", "b", "c"), **overrides})
    assert message in str(error.value)


def test_a_fixed_job_with_restarts_may_name_its_fewest_nodes():
    settings = launch_settings(nodes=("a", "b", "c"), max_restarts=2, elastic_min_workers=2, elastic=False)
    assert settings.job.max_restarts == 2 and settings.job.min_workers == 2 and not settings.job.elastic


def test_max_restarts_comes_from_the_env_file_unless_the_flag_gives_it():
    from launcher.host.planning.settings import job_options

    assert job_options({"MAX_RESTARTS": "2"}, {}).max_restarts == 2
    assert job_options({"MAX_RESTARTS": "2"}, {"max_restarts": 1}).max_restarts == 1
    assert job_options({}, {}).max_restarts == 0


def test_compose_reads_max_restarts():
    from launcher.agent import compose

    assert compose.job_options({"MAX_RESTARTS": "3"}, []).max_restarts == 3


# --- the job spec of a restart ------------------------------------------------------------------------------------
def test_a_restart_of_the_trainer_resumes_from_its_run_folders_checkpoints():
    first = job_spec(command=("python", "-m", "app.train", "--epochs", "3"), run_folder=RUN, max_restarts=1)
    again = JobSpec.from_json(first.to_json().replace('"restart": 0', '"restart": 1'))
    assert "--resume" not in first.command and again.command[-1] == "--resume"
    assert again.checkpoint_dir == f"{RUN}/checkpoints"
    assert f"{RESTART_VARIABLE}=1" in again.job_argv() and f"{RESTART_VARIABLE}=0" in first.job_argv()
    assert f"{CHECKPOINT_DIR_VARIABLE}={RUN}/checkpoints" in first.job_argv()


def test_a_users_script_gets_a_checkpoint_folder_in_the_run_folder_and_its_own_setting_stays():
    spec = job_spec(command=("python", "t.py"), run_folder=RUN, max_restarts=1, env=(f"{RESTART_VARIABLE}=7",))
    assert spec.command == ("python", "t.py") and spec.output_dir == RUN
    assert spec.restart_env == (f"{CHECKPOINT_DIR_VARIABLE}={RUN}/checkpoints",)


def test_without_restarts_the_ranks_environment_is_as_it_was():
    spec = job_spec(command=("python", "t.py"), run_folder=RUN)
    assert spec.restart_env == () and spec.checkpoint_dir is None and spec.output_dir is None
    assert not any(RESTART_VARIABLE in word for word in spec.job_argv())


# --- the agent -------------------------------------------------------------------------------------------------
def trainer_spec(**overrides) -> JobSpec:
    settings = {
        "command": ("python", "-m", "app.train", "--epochs", "3"),
        "run_folder": RUN,
        "expected_workers": 3,
        "workers": (W1, W2, W3),
        "ready_timeout": 5,
        "max_restarts": 2,
        "agent_host": W1.address,
    }
    return job_spec(**{**settings, **overrides})


def run(job: JobSpec, transport: Transport) -> tuple[JobEnd, list[str]]:
    said: list[str] = []
    clock = transport.clock
    end = Agent(job, transport, say=said.append, clock=clock, sleep=clock.sleep).run()
    return end, said


def up(*workers: Worker) -> dict[str, float]:
    return {worker.address: 0 for worker in workers}


def test_a_lost_node_restarts_the_job_on_those_that_remain_from_its_last_checkpoint():
    transport = Transport(Clock(), up_from=up(W1, W2, W3), status=137, lost_in_job={W2.address})
    transport.files[f"{RUN}/metrics.jsonl"] = '{"epoch": 1}\n{"epoch": 2}\n'
    end, said = run(trainer_spec(elastic_min_workers=2, elastic=False), transport)
    line = "restart 1/2: node_2's worker was lost; resuming after epoch 2 on node_1,node_3"
    done = restart.Restart(1, 2, "node_2's worker was lost", ("node_1", "node_3"), 2, f"{RUN}/checkpoints")
    assert end == JobEnd(0, restarts=(done,), state=RunState.SUCCEEDED) and done.line() == line
    assert line in said
    first, again = transport.ran
    assert "--resume" not in first and again[-1] == "--resume"
    assert again[again.index("-np") + 1] == "2" and f"{RESTART_VARIABLE}=1" in again
    assert transport.files["/home/mpiuser/hostfile"] == "10.0.0.1 slots=1\n10.0.0.3 slots=1\n"
    record = json.loads(transport.files[f"{RUN}/{restart.RECORDS_FILE}"])
    assert record == {
        "number": 1,
        "of": 2,
        "reason": "node_2's worker was lost",
        "workers": ["node_1", "node_3"],
        "resume_epoch": 2,
        "checkpoint_dir": f"{RUN}/checkpoints",
        "after": "workers_lost",
    }
    assert (W3.address, LEFTOVERS) in transport.commands and (W1.address, LEFTOVERS) not in transport.commands
    assert parse_job_end(transport.files[JOB_STATUS]) == end
    assert "job succeeded (exit status 0); the workers stop now" in said


def test_without_a_smaller_world_the_agent_waits_for_the_lost_worker_to_answer_again():
    transport = Transport(
        Clock(), up_from=up(W1, W2, W3), status=137, lost_in_job={W2.address}, returns_at={W2.address: 12}
    )
    end, said = run(trainer_spec(), transport)
    line = "restart 1/2: node_2's worker was lost; starting over on node_1,node_2,node_3"
    assert end.succeeded and end.last_restart() == line and len(end.restarts) == 1
    assert "waiting up to 30 s for node_2 to answer again" in said
    assert line in said
    assert transport.clock() >= 12 and transport.lines[W2.address].alive() is False  # told the job ended
    assert transport.told.get(W2.address) is None and parse_job_end(transport.lines[W2.address].last_word) == end


def test_a_lost_worker_that_never_answers_again_ends_the_job_saying_what_would_let_it_go_on():
    transport = Transport(Clock(), up_from=up(W1, W2, W3), status=137, lost_in_job={W2.address})
    end, said = run(trainer_spec(), transport)
    why = (
        "not restarted: node_2 did not answer again within 30 s and the job may not run on fewer nodes: pass "
        "--min-nodes 2 to let it go on without it"
    )
    assert end == JobEnd(
        137,
        "node_2: worker lost during the run; `launcher status` shows how each worker ended",
        lost=("node_2",),
        not_restarted=NotRestarted(Why.LOST_DID_NOT_RETURN, why),
        state=RunState.WORKERS_LOST,
    )
    assert end.line().endswith(why) and why in said  # what each worker's log says of the job's end
    assert len(transport.ran) == 1


def test_a_silent_node_is_named_so_in_the_restart_line():
    transport = Transport(Clock(), up_from=up(W1, W2, W3), status=1, silent_in_job={W2.address})
    end, said = run(trainer_spec(elastic_min_workers=1, elastic=False), transport)
    assert end.succeeded and end.last_restart() == "restart 1/2: node_2 went silent; starting over on node_1,node_3"
    assert "restart 1/2: node_2 went silent; starting over on node_1,node_3" in said


def test_the_scripts_own_failure_is_restarted_once_and_then_says_why_not():
    transport = Transport(Clock(), up_from=up(W1, W2, W3), status=1, restarts=(1,))
    end, said = run(trainer_spec(), transport)
    assert end.status == 1 and end.cause is None and len(transport.ran) == 2
    assert [done.line() for done in end.restarts] == [
        "restart 1/2: the script failed (exit status 1); starting over on node_1,node_2,node_3"
    ]
    assert end.restarts[0].after is RunState.FAILED and end.state is RunState.FAILED
    assert end.not_restarted and end.not_restarted.why is Why.SCRIPT_FAILED_AGAIN
    assert end.not_restarted.reason.startswith("not restarted: the script itself failed again")
    assert end.not_restarted.reason in said


def test_restarts_end_when_used_up():
    transport = Transport(Clock(), up_from=up(W1, W2, W3), status=137, lost_in_job={W3.address}, restarts=(137,))
    end, said = run(trainer_spec(max_restarts=1, elastic_min_workers=2, elastic=False), transport)
    assert end.status == 137 and len(transport.ran) == 2
    assert (
        "not restarted: all 1 restart(s) (--max-restarts 1) are used up; allow more with a larger --max-restarts"
        in said
    )


def test_a_job_told_to_stop_is_not_restarted():
    transport = Transport(Clock(), up_from=up(W1, W2, W3), status=137, lost_in_job={W2.address}, stop_asked=True)
    end, said = run(trainer_spec(elastic_min_workers=2, elastic=False), transport)
    assert end.status == 137 and len(transport.ran) == 1
    assert "not restarted: the job was told to stop (exit status 137)" in said


def test_without_max_restarts_a_lost_node_ends_the_job_as_before():
    transport = Transport(Clock(), up_from=up(W1, W2, W3), status=137, lost_in_job={W2.address})
    end, said = run(trainer_spec(max_restarts=0), transport)
    assert end == JobEnd(
        137,
        "node_2: worker lost during the run; `launcher status` shows how each worker ended",
        lost=("node_2",),
        state=RunState.WORKERS_LOST,
    )
    assert len(transport.ran) == 1 and not any("restart" in line for line in said)
    assert f"{RUN}/{restart.RECORDS_FILE}" not in transport.files


def test_a_users_script_is_told_its_checkpoint_folder_in_the_restart_line():
    transport = Transport(Clock(), up_from=up(W1, W2, W3), status=137, lost_in_job={W2.address})
    job = trainer_spec(command=("python", "t.py"), workdir="/workdir", elastic_min_workers=2, elastic=False)
    end, said = run(job, transport)
    line = (
        f"restart 1/2: node_2's worker was lost; resuming from the newest checkpoint in {RUN}/checkpoints on "
        "node_1,node_3"
    )
    assert end.succeeded and end.last_restart() == line and line in said
    assert transport.ran[1][-2:] == ["python", "t.py"]
    assert f"{CHECKPOINT_DIR_VARIABLE}={RUN}/checkpoints" in transport.ran[1]


def test_restart_options_round_trip_through_the_job_spec():
    options = JobOptions(max_restarts=2, elastic_min_workers=1)
    assert JobOptions.from_dict(options.to_dict()) == options


USED_UP = "not restarted: all 1 restart(s) (--max-restarts 1) are used up; allow more with a larger --max-restarts"
NOT_USED_UP = NotRestarted(Why.USED_UP, USED_UP)


@pytest.mark.parametrize(
    "seen, end, expected",
    [
        (
            "node_2: its worker container was killed during the run",
            JobEnd(137, "node_2: worker lost during the run", not_restarted=NOT_USED_UP),
            f"node_2: its worker container was killed during the run; {USED_UP}",
        ),
        (
            "node_2: its worker container was killed during the run",
            JobEnd(137, "node_2: worker lost during the run"),
            "node_2: its worker container was killed during the run",
        ),
        (
            None,
            JobEnd(137, "node_2: worker lost during the run", not_restarted=NOT_USED_UP),
            f"node_2: worker lost during the run; {USED_UP}",
        ),
        (None, JobEnd(1, None, not_restarted=NOT_USED_UP), None),  # no cause to name: the status is its own
        (f"x; {USED_UP}", JobEnd(1, "z", not_restarted=NOT_USED_UP), f"x; {USED_UP}"),
    ],
)
def test_one_root_cause_line_keeps_why_the_agent_did_not_restart(seen, end, expected):
    assert end.root_cause(seen) == expected
    assert JobEnd.from_json(end.to_json()) == end


@pytest.mark.parametrize(
    "given",
    [{"lost": [], "script_restarts": 1}, {"restarts": 3}, {"state": RunState.STALLED}, {"stop_asked": True}],
)
def test_every_refusal_starts_alike(given):
    refused = refusal(**given)
    assert refused and refused.reason.startswith("not restarted: ")


def test_a_restarts_run_has_what_is_left_of_the_jobs_time_limit(monkeypatch):
    from launcher.agent import watches

    given: list[float] = []

    class Recorded(watches.TimeLimit):
        def run(self) -> None:
            given.append(self.seconds)

    monkeypatch.setattr(watches, "TimeLimit", Recorded)
    transport = Transport(
        Clock(), up_from=up(W1, W2, W3), status=137, lost_in_job={W2.address}, returns_at={W2.address: 12}
    )
    end, _ = run(trainer_spec(time_limit=100), transport)
    assert end.succeeded and len(end.restarts) == 1 and transport.clock() >= 12
    assert given == [100, 100 - transport.clock()]


# --- spares ----------------------------------------------------------------------------------------------------
S4, S5 = Worker("node_4", "10.0.0.4"), Worker("node_5", "10.0.0.5")


@pytest.mark.parametrize(
    "lost, spares, expected",
    [
        ([], ["node_4"], (["node_1", "node_2", "node_3"], [])),
        (["node_2"], ["node_4", "node_5"], (["node_1", "node_4", "node_3"], [])),
        (["node_2", "node_3"], ["node_4"], (["node_1", "node_4", "node_3"], ["node_3"])),
        (["node_3"], [], (["node_1", "node_2", "node_3"], ["node_3"])),
    ],
)
def test_a_spare_takes_a_lost_workers_place(lost, spares, expected):
    assert restart.swap_in(["node_1", "node_2", "node_3"], lost, spares) == expected


def test_a_spare_is_checked_before_it_is_needed_then_takes_the_lost_nodes_place():
    transport = Transport(Clock(), up_from=up(W1, W2, W3, S4, S5), status=137, lost_in_job={W2.address})
    end, said = run(trainer_spec(spares=(S4, S5)), transport)
    assert end.succeeded and len(end.restarts) == 1
    assert said.index("node_4: spare, sshd answers; out of the hostfile until a restart needs it") < said.index(
        "hostfile: 10.0.0.1:1 10.0.0.2:1 10.0.0.3:1"
    )
    assert any(address == S4.address and "probe" in command for address, command in transport.commands[:40])
    assert "restart 1/2: node_2's worker was lost; starting over on node_1,node_4,node_3" in said
    assert transport.files["/home/mpiuser/hostfile"] == "10.0.0.1 slots=1\n10.0.0.4 slots=1\n10.0.0.3 slots=1\n"
    assert "ranks by node: node_1 0, node_4 1, node_3 2" in said  # the spare runs the lost node's rank now
    assert not any(line.startswith("waiting up to") for line in said)
    assert parse_job_end(transport.lines[S5.address].last_word) == end  # the unused spare is told, and stops


def test_a_spare_that_does_not_answer_is_passed_over_for_the_next():
    transport = Transport(
        Clock(), up_from={**up(W1, W2, W3, S5), S4.address: float("inf")}, status=137, lost_in_job={W2.address}
    )
    end, said = run(trainer_spec(spares=(S4, S5)), transport)
    assert end.succeeded and len(end.restarts) == 1
    assert "node_4: spare, does not answer yet; tried again when a restart needs it" in said
    assert "restart 1/2: node_2's worker was lost; starting over on node_1,node_5,node_3" in said


def test_with_no_spare_left_the_smaller_world_or_the_wait_decides():
    transport = Transport(Clock(), up_from=up(W1, W2, W3, S4), status=137, lost_in_job={W2.address, W3.address})
    end, said = run(trainer_spec(spares=(S4,), elastic_min_workers=2, elastic=False), transport)
    assert end.succeeded and len(end.restarts) == 1
    assert "restart 1/2: node_2's worker was lost and node_3's worker was lost; starting over on node_1,node_4" in said


def test_a_lost_spare_does_not_end_the_job():
    from launcher.agent.watches import LifelineWatch

    transport = Transport(Clock(), up_from=up(W1, W2, W3, S4))
    said: list[str] = []
    agent = Agent(
        trainer_spec(spares=(S4,)), transport, say=said.append, clock=transport.clock, sleep=transport.clock.sleep
    )
    agent.workers.claim([W1, W2, W3, S4])
    agent.workers.start_run([W1, W2, W3])
    transport.lines[S4.address].open = False
    watch = LifelineWatch(agent.workers)
    watch.check()
    assert watch.cause is None and not transport.ended.is_set()
    assert said == ["node_4: worker lost during the run; a spare, not used by any restart"]
    assert agent.restarter.answering_spares(1) == []


def test_spares_travel_in_the_job_spec():
    spec = trainer_spec(spares=(S4,))
    assert JobSpec.from_json(spec.to_json()).spares == (S4,)
    assert "10.0.0.4" not in " ".join(spec.job_argv())


# --- spares on the host side -------------------------------------------------------------------------------------
def test_spares_come_from_the_flag_or_the_env_file_with_their_own_rank_counts():
    from launcher.host.planning.settings import resolve_settings

    flagged = resolve_settings({"MAX_RESTARTS": "1"}, nodes="node_1,node_2", spares="node_4:2,node_5")
    assert flagged.nodes == ("node_1", "node_2") and flagged.spares == ("node_4", "node_5")
    assert flagged.node_slots == {"node_4": 2} and flagged.all_nodes[-2:] == ("node_4", "node_5")
    from_env = resolve_settings(
        {"MAX_RESTARTS": "1", "SPARES": "node_4", "DOCKER_HOST_NODE_4": "tcp://127.0.0.1:1"}, nodes="node_1,node_2"
    )
    assert from_env.spares == ("node_4",) and from_env.engine_url("node_4") == "tcp://127.0.0.1:1"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"spares": ("node_4",), "max_restarts": 0},
            "--spares stand in for a lost node when the job restarts: add --max-restarts N (MAX_RESTARTS in .env)",
        ),
        ({"spares": ("node_2",)}, "spare node_2 is listed twice (in --nodes or --spares): list each host once"),
        ({"spares": ("node_4", "node_4")}, "spare node_4 is listed twice"),
        ({"spares": ("bad name",)}, "spare 'bad name' is not a host name"),
    ],
)
def test_bad_spares_are_refused(overrides, message):
    with pytest.raises(SettingsError) as error:
        launch_settings(**{"nodes": ("node_1", "node_2"), "max_restarts": 1, **overrides})
    assert message in str(error.value)


def test_a_spare_gets_a_worker_but_no_place_in_the_hostfile():
    from tests.conftest import plan_of

    plan = plan_of(nodes=("node_1", "node_2"), spares=("node_4",), max_restarts=1, slots=2)
    assert [node.name for node in plan.nodes] == ["node_1", "node_2", "node_4"]
    assert [node.name for node in plan.job_nodes] == ["node_1", "node_2"] and plan.total_ranks == 4
    assert [plan.labels(node)["horovod-stack.role"] for node in plan.nodes] == ["rank0", "worker", "spare"]
    spec = plan.job_spec()
    assert [worker.name for worker in spec.workers] == ["node_1", "node_2"] and spec.expected_workers == 2
    assert [worker.name for worker in spec.spares] == ["node_4"]
    assert spec.job_argv()[spec.job_argv().index("-np") + 1] == "4"
    assert plan.worker_container(plan.nodes[2]).hostname == "node-4"
    report = plan.dry_run_report(None)
    assert "plan: 4 ranks on 2 node(s) and 1 spare(s)" in report
    assert "node_4 (spare, out of the hostfile until a restart needs it;" in report
    assert "node_4 slots" not in report
    assert ", up to 1 restart(s), spares node_4\n" in plan.describe()
