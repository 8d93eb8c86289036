"""The job agent's decisions, with a stand-in transport: readiness, host-key pinning, the hostfile, failure causes,
and how every worker learns that the job ended. (The real ssh, mpirun and containers: test_compose.py and
test_launcher_multihost.py.)"""

from __future__ import annotations

import dataclasses
import io
import json
import threading
import time
from pathlib import Path

import pytest

from launcher.agent import __main__ as agent
from launcher.agent import compose
from launcher.agent.job import Agent
from launcher.agent.watches import ElasticClaims, LifelineWatch
from launcher.agent.workers import say
from launcher.core.jobend import JobEnd, parse_job_end
from launcher.core.jobspec import JobSpec, Worker
from launcher.core.options import SettingsError
from launcher.core.protocol import (
    HOSTFILE_PATH,
    JOB_LOG,
    JOB_LOST,
    JOB_PRIVATE_FILES,
    JOB_SPEC,
    JOB_STATUS,
    KEEP_RUNNING,
    KNOWN_HOSTS,
    lost_driver_message,
)
from launcher.core.restart import NotRestarted, Restart, Why
from launcher.core.runs import LostWorker, RunState
from tests.conftest import job_spec
from tests.standins import Clock
from tests.standins import StandInTransport as Transport

W1, W2 = Worker("node_1", "10.0.0.1"), Worker("node_2", "10.0.0.2")
SUCCEEDED = JobEnd(0, state=RunState.SUCCEEDED)


def spec(**overrides) -> JobSpec:
    settings = {
        "job_id": "j1",
        "command": ("python", "t.py"),
        "expected_workers": 2,
        "workers": (W1, W2),
        "workdir": "/workdir",
        "ready_timeout": 5,
    }
    return job_spec(**{**settings, **overrides})


def run(job: JobSpec, clock: Clock, transport: Transport) -> tuple[JobEnd, list[str]]:
    said: list[str] = []
    end = Agent(job, transport, say=said.append, clock=clock, sleep=clock.sleep).run()
    return end, said


def test_the_job_runs_once_every_worker_answers_and_every_worker_is_told_how_it_ended():
    clock = Clock()
    transport = Transport(clock, up_from={W1.address: 0, W2.address: 3})  # node_2's sshd comes up 3 s later
    end, said = run(spec(), clock, transport)
    assert end == SUCCEEDED
    assert "node_1: sshd answers on port 12345 (1/2 workers answer over ssh)" in said
    assert "node_2: sshd answers on port 12345 (2/2 workers answer over ssh)" in said
    assert transport.files[KNOWN_HOSTS] == (
        "[10.0.0.1]:12345 ssh-ed25519 KEY-10.0.0.1\n[10.0.0.2]:12345 ssh-ed25519 KEY-10.0.0.2\n"
    )
    assert transport.files[HOSTFILE_PATH] == "10.0.0.1 slots=1\n10.0.0.2 slots=1\n"
    assert transport.ran == [spec().job_argv()]
    assert parse_job_end(transport.files[JOB_STATUS]) == SUCCEEDED
    assert {address: parse_job_end(line.last_word) for address, line in transport.lines.items()} == {
        W1.address: SUCCEEDED,
        W2.address: SUCCEEDED,
    }
    assert said[-1] == "job succeeded (exit status 0); the workers stop now"


def test_the_worker_that_hosts_the_agent_hears_last():
    """The launcher's rank 0 stops soon after it hears, and the agent in its container with it."""
    clock = Clock()
    transport = Transport(clock, up_from={W1.address: 0, W2.address: 0})
    run(spec(agent_host=W1.address), clock, transport)
    assert transport.heard == [W2.address, W1.address]


def test_a_job_whose_ranks_fail_keeps_their_status_and_names_no_cause_of_its_own():
    clock = Clock()
    transport = Transport(clock, up_from={W1.address: 0, W2.address: 0}, status=3)
    end, said = run(spec(), clock, transport)
    assert end == JobEnd(3, state=RunState.FAILED) == parse_job_end(transport.files[JOB_STATUS])
    assert "mpirun exited with status 3" in said and "job FAILED (exit status 3); the workers stop now" in said
    assert {line.last_word for line in transport.lines.values()} == {end.to_json()}


KERAS3_TRACEBACK = tuple(
    f"[1,1]<stderr>:{line}"
    for line in (
        "Traceback (most recent call last):",
        '  File "/workdir/tensorflow2_mnist.py", line 89, in <module>',
        "    loss_value = training_step(images, labels, batch == 0)",
        "TypeError: in user code:",
        "",
        '    File "/workdir/tensorflow2_mnist.py", line 73, in training_step  *',
        "        hvd.broadcast_variables(opt.variables(), root_rank=0)",
        "",
        "    TypeError: 'list' object is not callable",
    )
)
"""Rank 1 of Horovod's tensorflow2_mnist.py on Keras 3, as mpirun passes its lines on (test_legacy_keras.py has the
whole traceback)."""


@pytest.mark.parametrize(
    "job, env, fix, node",
    [
        (spec(), (), "launcher start --env TF_USE_LEGACY_KERAS=1 ...", "node_2"),
        (compose.job_spec({"WORKERS": "2", "TRAIN_COMMAND": "python tensorflow2_mnist.py"}, []), (),
         'TRAIN_COMMAND="env TF_USE_LEGACY_KERAS=1 python tensorflow2_mnist.py" in .env', "172.18.0.3"),
        (spec(env=("TF_USE_LEGACY_KERAS=1",)), ("TF_USE_LEGACY_KERAS=1",), None, None),  # Keras 2: no such cause
    ],
)  # fmt: skip
def test_a_rank_that_dies_of_keras2_code_on_keras3_is_the_jobs_cause_with_the_launch_methods_fix(job, env, fix, node):
    clock = Clock()
    up: dict[str, float] = {address: 0 for address in (W1.address, W2.address, "172.18.0.2", "172.18.0.3")}
    transport = Transport(clock, up_from=up, resolves=["172.18.0.2", "172.18.0.3"], status=1, output=KERAS3_TRACEBACK)
    end, said = run(job, clock, transport)
    assert all(f"-x {pair}" in " ".join(transport.ran[0]) for pair in env)
    if fix is None:
        assert end == JobEnd(1, state=RunState.FAILED)
        return
    cause = (
        f"rank 1 on {node}: Keras 2 code on Keras 3, horovod-stack:tensorflow's default (a Keras 3 optimizer's "
        f"`variables` is a list, not a method): run it with TF_USE_LEGACY_KERAS=1 for Keras 2, {fix} "
        "(TypeError: 'list' object is not callable)"
    )
    assert end == JobEnd(1, cause, state=RunState.FAILED, failed_rank=1) == parse_job_end(transport.files[JOB_STATUS])
    assert said[said.index("mpirun exited with status 1") + 1] == f"error: {cause}"
    assert {line.last_word for line in transport.lines.values()} == {end.to_json()}


def test_workers_that_never_answer_fail_the_job_in_one_line_and_those_that_did_are_told():
    clock = Clock()
    transport = Transport(clock, up_from={W1.address: 0})
    end, said = run(spec(), clock, transport)
    assert end.status == 2 and transport.ran == []
    assert end.cause == (
        "only 1 of 2 workers answered ssh on port 12345 within 5 s (still waiting for node_2); check "
        "that rank 0 reaches those hosts by name and that the port is open between nodes"
    )
    assert f"error: {end.cause}" in said
    assert transport.told == {W1.address: end.to_json()}  # no agent connection yet: told over a connection of its own
    assert said[-1].startswith("could not reach node_2 to say the job ended; a worker no job claims stops by itself")


def test_a_command_a_worker_cannot_start_is_named_before_mpirun():
    clock = Clock()
    transport = Transport(clock, up_from={W1.address: 0, W2.address: 0}, cannot_start={W2.address})
    end, said = run(spec(), clock, transport)
    assert transport.ran == [] and not any(line.startswith("mpirun exited") for line in said)
    assert end == JobEnd(
        2,
        "node_2: cannot start `python t.py` in /workdir: script t.py is not there; pass "
        "--workdir with the folder that holds your code, or build an image FROM "
        "horovod-stack:latest that has it",
    )
    assert {line.last_word for line in transport.lines.values()} == {end.to_json()}


def test_a_worker_lost_during_the_run_is_the_jobs_root_cause():
    clock = Clock()
    transport = Transport(clock, up_from={W1.address: 0, W2.address: 0}, status=1, lost_in_job={W2.address})
    end, said = run(spec(), clock, transport)
    assert end == JobEnd(
        1,
        "node_2: worker lost during the run; `launcher status` shows how each worker ended",
        lost=("node_2",),
        state=RunState.WORKERS_LOST,
    )
    assert transport.lines[W1.address].last_word == end.to_json()
    assert transport.told == {} and not any("could not reach" in line for line in said)  # node_2 knows: its line closed


def test_a_worker_that_goes_silent_ends_a_fixed_job_at_once_with_the_silence_as_its_cause():
    """A pulled cable or a powered-off node: no reset, the ranks would wait in their collective forever."""
    clock = Clock()
    transport = Transport(clock, up_from={W1.address: 0, W2.address: 0}, silent_in_job={W2.address})
    end, said = run(spec(), clock, transport)
    cause = "node_2 went silent (no answer for 15 s: link down, host down or powered off)"
    assert (
        end
        == JobEnd(143, cause, lost=("node_2",), state=RunState.WORKERS_LOST)
        == parse_job_end(transport.files[JOB_STATUS])
    )
    assert f"error: {cause}; ending the job" in said
    assert transport.lines[W1.address].last_word == end.to_json()
    assert JOB_LOST not in transport.files  # host discovery is an elastic job's


def test_an_elastic_job_drops_a_silent_worker_from_host_discovery_and_goes_on(tmp_path):
    clock = Clock()
    job = compose.job_spec({"WORKERS": "2", "ELASTIC_MIN_WORKERS": "1", "NETWORK_INTERFACE": "eth0"}, [])
    up: dict[str, float] = {"172.18.0.2": 0, "172.18.0.3": 0}
    transport = Transport(clock, up_from=up, resolves=["172.18.0.2", "172.18.0.3"], silent_in_job={"172.18.0.3"})
    end, said = run(job, clock, transport)
    assert end == SUCCEEDED
    assert (
        "172.18.0.3 went silent (no answer for 15 s: link down, host down or powered off); host discovery drops "
        "it and the elastic job goes on without it"
    ) in said
    assert transport.files[JOB_LOST] == "172.18.0.3\n"
    up["172.18.0.3"] = 0  # the link is back: the old worker answers until it notices and stops
    transport.files[JOB_SPEC] = job.to_json()
    (tmp_path / f".elastic-discovery-{job.job_id}").touch()
    assert agent.discover(transport, marker_dir=str(tmp_path)) == ["172.18.0.2:1"]


@pytest.mark.parametrize(
    "restart_workers, said_after",
    [(False, ""), (True, " (its engine's restart 1 of at most 5, --worker-restarts)")],
)
def test_a_lost_worker_is_claimed_again_only_as_a_new_worker(restart_workers, said_after):
    """The old worker on a node that comes back is not taken back (it stops by itself); a new one there is."""
    clock = Clock()
    job = compose.job_spec({"WORKERS": "2", "ELASTIC_MIN_WORKERS": "1", "NETWORK_INTERFACE": "eth0"}, [])
    job = dataclasses.replace(job, options=dataclasses.replace(job.options, restart_workers=restart_workers))
    transport = Transport(clock, up_from={"172.18.0.2": 0, "172.18.0.3": 0}, resolves=["172.18.0.2", "172.18.0.3"])
    said: list[str] = []
    job_agent = Agent(job, transport, say=said.append, clock=clock, sleep=clock.sleep)
    subject = job_agent.workers
    subject.claim(job_agent.wait_until_ready())
    transport.lines["172.18.0.3"].open, transport.lines["172.18.0.3"].went_silent = False, True
    LifelineWatch(subject).check()
    assert subject.lost() == {"172.18.0.3": LostWorker("172.18.0.3", silent=True)}
    claims = ElasticClaims(subject)
    claims.claim_round()  # the old worker answers, but it was claimed before
    assert not transport.lines["172.18.0.3"].alive() and transport.files[JOB_LOST] == "172.18.0.3\n"
    transport.fresh.add("172.18.0.3")  # its container started again
    claims.claim_round()
    assert not subject.is_lost("172.18.0.3")
    assert transport.lines["172.18.0.3"].alive() and transport.files[JOB_LOST] == ""
    assert f"172.18.0.3: a new worker there is claimed; host discovery lists it again{said_after}" in said


def test_secret_settings_reach_mpirun_by_name_and_its_environment_by_value():
    clock = Clock()
    transport = Transport(clock, up_from={W1.address: 0, W2.address: 0}, secret_values={"API_KEY": "sk-SECRET"})
    end, said = run(spec(secrets=("API_KEY",)), clock, transport)
    assert end == SUCCEEDED
    argv = transport.ran[0]
    assert argv[argv.index("API_KEY") - 1] == "-x" and not any("sk-SECRET" in word for word in argv)
    assert transport.ran_with == {"API_KEY": "sk-SECRET"}
    assert not any("sk-SECRET" in line for line in said)
    assert transport.removed == list(JOB_PRIVATE_FILES)  # once every other worker was told


def test_a_secret_that_did_not_arrive_refuses_the_job_before_it_runs():
    clock = Clock()
    transport = Transport(clock, up_from={W1.address: 0, W2.address: 0})
    end, _ = run(spec(secrets=("API_KEY",)), clock, transport)
    assert transport.ran == [] and end.status == 2
    assert end.cause == (
        "the secret setting(s) API_KEY did not reach the job's agent: start the job again with "
        "--secret and the value in the launching machine's environment"
    )


def test_an_elastic_job_below_its_minimum_names_the_lost_workers():
    clock = Clock()
    job = compose.job_spec(
        {"WORKERS": "2", "ELASTIC_MIN_WORKERS": "2", "NETWORK_INTERFACE": "eth0", "ELASTIC_TIMEOUT": "10"}, []
    )
    transport = Transport(
        clock,
        up_from={"172.18.0.2": 0, "172.18.0.3": 0},
        resolves=["172.18.0.2", "172.18.0.3"],
        status=1,
        lost_in_job={"172.18.0.3"},
    )
    end, said = run(job, clock, transport)
    assert transport.files["cluster key"] == "made" and transport.run_dirs == [job.run_dir]
    assert transport.ran[0][transport.ran[0].index("horovodrun") + 1] == "--gloo"
    assert end == JobEnd(
        1,
        "the elastic job fell below ELASTIC_MIN_WORKERS=2 for 10 s: lost 172.18.0.3; "
        "`docker compose ps -a` shows how they ended",
        lost=("172.18.0.3",),
        state=RunState.WORKERS_LOST,
    )
    assert said[-2:] == [
        "job FAILED (exit status 1); the workers stop now",
        f"results: {job.run_dir} (metrics.jsonl, curves.png, tb/, checkpoints/)",
    ]


def test_the_jobs_whole_output_is_kept_in_its_run_folder_before_its_end_is_told():
    clock = Clock()
    transport = Transport(clock, up_from={W1.address: 0, W2.address: 0})
    transport.files[JOB_LOG] = "[1,0]<stdout>:hello\n[1,1]<stdout>:hello\n"
    end, _ = run(spec(run_folder="/shared/runs/c0ffee00"), clock, transport)
    assert end == SUCCEEDED
    assert transport.files["/shared/runs/c0ffee00/job.log"] == "[1,0]<stdout>:hello\n[1,1]<stdout>:hello\n"
    assert list(transport.files).index("/shared/runs/c0ffee00/job.log") < list(transport.files).index(JOB_STATUS)


def test_keep_running_leaves_the_workers_up():
    clock = Clock()
    transport = Transport(clock, up_from={W1.address: 0, W2.address: 0})
    end, said = run(spec(keep_running=True), clock, transport)
    assert end == SUCCEEDED and {line.last_word for line in transport.lines.values()} == {KEEP_RUNNING}
    assert said[-1] == "job succeeded (exit status 0); the workers keep running (--keep-running)"
    assert transport.removed == []  # kept for debugging in the running containers


def test_compose_secrets_are_the_files_named_like_variables_and_reach_mpirun_by_name(tmp_path, monkeypatch):
    from launcher.agent import transport as transports

    assert compose.secret_names(["WANDB_API_KEY", "HF_TOKEN", "not-a-name", ".hidden"]) == ("HF_TOKEN", "WANDB_API_KEY")
    job = compose.job_spec({"WORKERS": "2"}, [], ("HF_TOKEN",))
    argv = job.job_argv()
    assert job.options.secrets == ("HF_TOKEN",) and argv[argv.index("HF_TOKEN") - 1] == "-x"
    (tmp_path / "HF_TOKEN").write_text("hf-value\n")
    monkeypatch.setattr(transports, "COMPOSE_SECRETS_DIR", str(tmp_path))
    monkeypatch.setattr(transports, "SECRETS_FILE", str(tmp_path / "absent.json"))
    found = transports.SshTransport()
    assert found.list_folder(str(tmp_path)) == ["HF_TOKEN"]
    assert found.take_secrets(("HF_TOKEN", "MISSING")) == {"HF_TOKEN": "hf-value"}  # its last line break is not in it


def test_a_refused_compose_job_still_tells_the_workers_that_are_up():
    clock = Clock()
    environ = {"ELASTIC_MIN_WORKERS": "3"}
    transport = Transport(clock, up_from={"172.18.0.2": 0, "172.18.0.3": 4}, resolves=["172.18.0.2", "172.18.0.3"])
    with pytest.raises(SettingsError) as refused:
        compose.job_spec(environ, [])
    said: list[str] = []
    end = Agent(compose.fallback_spec(environ), transport, say=said.append, clock=clock, sleep=clock.sleep).refuse(
        str(refused.value)
    )
    assert end.status == 2 and said[0] == f"error: {refused.value}"
    assert "job FAILED (exit status 2); the workers stop now" in said
    assert transport.told == {"172.18.0.2": end.to_json(), "172.18.0.3": end.to_json()}  # one came up 4 s later


def test_discovery_names_rank0_alone_first_then_every_answering_worker(tmp_path):
    clock = Clock()
    up: dict[str, float] = {W1.address: 0, W2.address: 0}
    transport = Transport(clock, up_from=up)
    transport.files[JOB_SPEC] = spec(elastic_min_workers=1, slots=2, network_interface="eth0").to_json()
    assert agent.discover(transport, marker_dir=str(tmp_path)) == ["10.0.0.1:2"]
    assert agent.discover(transport, marker_dir=str(tmp_path)) == ["10.0.0.1:2", "10.0.0.2:2"]
    up[W2.address] = float("inf")  # lost
    assert agent.discover(transport, marker_dir=str(tmp_path)) == ["10.0.0.1:2"]


@pytest.mark.parametrize(
    "last_line, recorded",
    [
        (JobEnd(3).to_json() + "\n", JobEnd(3).to_json() + "\n"),
        (
            JobEnd(2, "node_2: cannot start `x`").to_json() + "\n",
            JobEnd(2, "node_2: cannot start `x`").to_json() + "\n",
        ),
        ("exit status 3\n", lost_driver_message("rank 0's container on node_1") + "\n"),  # not a record: no end
        ("", lost_driver_message("rank 0's container on node_1") + "\n"),  # the line closed: the agent is gone
        (f"{KEEP_RUNNING}\n", None),
    ],
)
def test_a_workers_end_of_the_lifeline_records_how_the_job_ended(tmp_path, last_line, recorded):
    end_file, claimed = tmp_path / "job-ended", tmp_path / "claimed"
    agent.lifeline("rank 0's container on node_1", io.StringIO(last_line), end_file=str(end_file), claimed=str(claimed))
    assert claimed.exists()
    assert (end_file.read_text() if end_file.exists() else None) == recorded


def test_follow_prints_the_whole_log_then_returns_the_jobs_status(tmp_path):
    log, status = tmp_path / "job.log", tmp_path / "job.status"
    log.write_text("first\n")

    def finish_later() -> None:
        time.sleep(0.5)
        with log.open("a") as out:
            out.write("last\n")
        status.write_text(JobEnd(4, "why").to_json() + "\n")

    writer = threading.Thread(target=finish_later)
    writer.start()
    out = io.BytesIO()
    assert agent.follow(out, poll=0.05, log_path=str(log), status_path=str(status)) == 4
    writer.join()
    assert out.getvalue() == b"first\nlast\n"


@pytest.mark.parametrize(
    "end, line",
    [
        (JobEnd(0), "exit status 0"),
        (
            JobEnd(2, "node_2: cannot start `x`; pass --workdir"),
            "exit status 2: node_2: cannot start `x`; pass --workdir",
        ),
        (
            JobEnd(
                137,
                "node_2: worker lost during the run",
                lost=("node_2",),
                restarts=(Restart(1, 1, "node_3 went silent", ("node_1", "node_2"), 4, "/shared/ck"),),
                not_restarted=NotRestarted(Why.USED_UP, "not restarted: all 1 restart(s) are used up"),
                state=RunState.WORKERS_LOST,
            ),
            "exit status 137: node_2: worker lost during the run; not restarted: all 1 restart(s) are used up",
        ),
        (JobEnd(1, state=RunState.FAILED, failed_rank=3), "exit status 1"),
    ],
)
def test_the_job_end_record_crosses_as_json_and_reads_back_whole(end, line):
    """The agent's last word to each worker and JOB_STATUS are one record: read back as it was, no prose parsed."""
    assert parse_job_end(end.to_json() + "\n") == end
    assert end.line() == line


@pytest.mark.parametrize("text", ["lost: the agent went away", "exit status 0", "7", "{not json", "[1]", "", None])
def test_anything_but_a_job_end_record_is_no_job_end(text):
    assert parse_job_end(text) is None


def test_job_spec_json_is_what_discovery_reads():
    job = spec(elastic_min_workers=1, network_interface="eth0")
    assert json.loads(job.to_json())["workers"][1] == {"name": "node_2", "address": "10.0.0.2", "slots": None}
    assert JobSpec.from_json(job.to_json()) == job


def test_the_agents_own_lines_are_marked_for_the_launcher(capsys):
    say("node_1: sshd answers")
    line = capsys.readouterr().out
    assert line.startswith("[agent ") and line.endswith("] node_1: sshd answers\n")


def test_shell_settings_are_the_protocols(capsys):
    from launcher.core import protocol

    assert protocol.main(["shell"]) == 0
    printed = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert printed["DEFAULT_SSH_PORT"] == "12345" and printed["JOB_END_FILE"] == protocol.JOB_END_FILE
    from launcher.core import jobend

    record = JobEnd(5, "x").to_json()
    assert jobend.main(["exit-code", record]) == 0 and capsys.readouterr().out == "5\n"
    assert jobend.main(["exit-code", lost_driver_message("the agent")]) == 0 and capsys.readouterr().out == "1\n"
    assert jobend.main(["line", record]) == 0 and capsys.readouterr().out == "exit status 5: x\n"
    assert jobend.main(["line", "lost: x went away"]) == 0 and capsys.readouterr().out == "lost: x went away\n"
    assert Path(protocol.DISCOVERY_SCRIPT).name == "discover-hosts.sh"


def test_discovery_and_the_hostfile_give_each_worker_its_own_rank_count(tmp_path):
    clock = Clock()
    transport = Transport(clock, up_from={W1.address: 0, W2.address: 0})
    workers = (Worker("node_1", "10.0.0.1", 4), Worker("node_2", "10.0.0.2", 2))
    transport.files[JOB_SPEC] = spec(elastic_min_workers=1, workers=workers, network_interface="eth0").to_json()
    agent.discover(transport, marker_dir=str(tmp_path))
    assert agent.discover(transport, marker_dir=str(tmp_path)) == ["10.0.0.1:4", "10.0.0.2:2"]
    end, said = run(spec(workers=workers), clock, transport)
    assert transport.files[HOSTFILE_PATH] == "10.0.0.1 slots=4\n10.0.0.2 slots=2\n"
    assert "hostfile: 10.0.0.1:4 10.0.0.2:2" in said
    assert "ranks by node: node_1 0-3, node_2 4-5" in said  # what `launcher logs --node` goes by


def test_a_job_past_its_time_limit_is_ended_with_every_ranks_stack_and_exit_status_124():
    from launcher.agent.stacks import Frame, RankStack

    waiting = {
        W1.address: [RankStack(0, "node_1", 7, (Frame("allreduce", "mpi_ops.py", 240),))],
        W2.address: [RankStack(1, "node_2", 8, (Frame("wait_for_data", "/workdir/t.py", 14),))],
    }
    transport = Transport(up_from={W1.address: 0, W2.address: 0}, stacks_of=waiting, until_stopped=True)
    said: list[str] = []
    started = time.monotonic()
    end = Agent(spec(time_limit=1, stall_timeout=0), transport, say=said.append).run()
    assert 1 <= time.monotonic() - started < 5
    assert end.status == 124 and end.cause is not None
    assert end.cause == (
        "the job ran past its time limit of 1 s; rank 0 (node_1 pid 7) in allreduce at "
        "mpi_ops.py:240; rank 1 (node_2 pid 8) in wait_for_data at t.py:14"
    )
    assert "the job ran past its time limit of 1 s; every rank's stack:" in said
    assert {line.last_word for line in transport.lines.values()} == {end.to_json()}  # every worker told


def test_without_ptrace_a_job_past_its_time_limit_ends_without_trying_for_stacks():
    transport = Transport(up_from={W1.address: 0, W2.address: 0}, until_stopped=True)
    said: list[str] = []
    end = Agent(spec(time_limit=1, stall_timeout=0, ptrace=False), transport, say=said.append).run()
    assert end.status == 124 and end.cause == "the job ran past its time limit of 1 s; no stacks"
    assert (
        "the job ran past its time limit of 1 s; no stacks: the workers run without SYS_PTRACE (started with "
        "--no-ptrace, or PTRACE=0 in .env; an MPIJob exported without --ptrace)"
    ) in said
    assert not any("stacks collect" in command for _, command in transport.commands)


def test_a_job_within_its_time_limit_is_not_touched():
    transport = Transport(up_from={W1.address: 0, W2.address: 0})
    end, said = run(spec(time_limit=60), Clock(), transport)
    assert end == SUCCEEDED and not transport.ended.is_set()


@pytest.mark.parametrize(
    "environ, hint",
    [
        (
            {"RESULTS_HINT": "the volume horovod-stack_shared", "RESULTS_DIR": "./runs"},
            "the volume horovod-stack_shared; copy it here: docker compose cp launcher:/shared/runs/r1 ./runs/",
        ),
        ({"RESULTS_DIR": "my results/"}, "copy it here: docker compose cp launcher:/shared/runs/r1 'my results/'"),
        ({"RESULTS_HINT": "the volume v"}, "the volume v"),  # no RESULTS_DIR (a compose file of one's own)
        ({}, None),
    ],
)
def test_compose_names_where_the_results_are_and_the_one_command_that_copies_them_out(environ, hint):
    assert compose.results_hint(environ, "/shared/runs/r1") == hint
    assert compose.job_spec({**environ, "RUN_ID": "r1"}, []).results_hint == hint  # the bundled trainer's folder
    yours = {**environ, "RUN_ID": "r1", "TRAIN_COMMAND": "python train.py"}
    assert compose.job_spec({**yours, "TIMELINE": "1"}, []).results_hint == hint  # Horovod's records there
    # A command of the user's with no records: the agent makes no run folder, so no copy is named.
    assert compose.job_spec(yours, []).results_hint == compose.results_hint(environ, None)
    assert "docker compose cp" not in (compose.results_hint(environ, None) or "")
