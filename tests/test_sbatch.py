"""The Slurm export without a cluster: the batch script's text for each combination of options (table tests, each
script checked by `bash -n`), the script run by bash with stand-ins for srun and apptainer (what every rank's container
would be given: its command, binds and environment; a missing secret and too many requeues stop it in one line), the
refusal of every `launcher start` option that means nothing on Slurm, and the command line. The live cluster's tests
(tests/test_slurm_*.py) run the same scripts under Slurm and Apptainer.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.core.options import SettingsError, job_command
from launcher.host.planning import export_flags, flags
from launcher.slurm import sbatch, sbatch_request

TRAIN = ("--dataset", "digits", "--epochs", "5")
SIF, SHARED = "/cluster/images/horovod-stack.sif", "/cluster/team/shared"
JOB_FIELDS = {"env", "secrets", "network_interface", "time_limit", "max_restarts", "timeline", "autotune", "workdir"}
JOB_FIELDS |= {"mounts", "command", "stall_timeout", "stall_action"}
SECRET_VALUE = "s3cr3t-value-never-written"


def request(**fields) -> sbatch_request.SbatchRequest:
    """The request `launcher export sbatch` makes for these flags (the job options' by their JobOptions names)."""
    job = {"command": job_command(TRAIN), **{key: fields.pop(key) for key in list(fields) if key in JOB_FIELDS}}
    return sbatch_request.request(job, **{"nodes": "2", "sif": SIF, "shared": SHARED, **fields})


def exported(**fields) -> str:
    text = sbatch.script(request(**fields))
    checked = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    return text


def srun_line(text: str) -> str:
    """The rank-start command, its continuation lines joined."""
    return text.split("\nsrun ", 1)[1].replace(" \\\n  ", " ")


CASES = {
    "cpu, defaults": (
        {},
        [
            "#SBATCH --job-name=horovod-stack",
            "#SBATCH --nodes=2",
            "#SBATCH --ntasks-per-node=1",
            "#SBATCH --output=%x-%j.out",
            "#SBATCH --export=ALL",
            "#SBATCH --no-requeue",
            f"sif={SIF}",
            "export APPTAINERENV_OMPI_MCA_mpi_yield_when_idle=1",
            "export APPTAINERENV_NCCL_DEBUG=WARN",
            "export APPTAINERENV_NCCL_SOCKET_IFNAME='^lo,docker,br-,veth,virbr'",
            f'run_folder={SHARED}/runs/horovod-stack-"${{SLURM_JOB_ID}}"',
        ],
        ["--gpus-per-node", "--nv", "--time", "--partition", "--account", "--requeue\n", "--pwd", "resume"],
    ),
    "3 slots, one node": (
        {"slots": 3, "nodes": "1"},
        ["#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=3", "APPTAINERENV_RENDEZVOUS_RANKS=3 \\"],
        ["NCCL_SOCKET_IFNAME"],  # one node: no NIC between nodes to choose
    ),
    "gpus": (
        {"gpus_per_node": 4},
        [
            "#SBATCH --ntasks-per-node=4",
            "#SBATCH --gpus-per-node=4",
            "apptainer exec --cleanenv --nv --bind",
            "export APPTAINERENV_HOROVOD_STACK_GPUS=1",
            "export APPTAINERENV_TF_FORCE_GPU_ALLOW_GROWTH=true",
        ],
        [],
    ),
    "partition, account, Slurm's time": (
        {"partition": "gpu", "account": "team-a", "time": "1-12:00:00", "name": "digits"},
        [
            "#SBATCH --partition=gpu",
            "#SBATCH --account=team-a",
            "#SBATCH --time=1-12:00:00",
            "#SBATCH --job-name=digits",
            f'run_folder={SHARED}/runs/digits-"${{SLURM_JOB_ID}}"',
        ],
        [],
    ),
    "start's time limit in seconds": ({"time_limit": 5400}, ["#SBATCH --time=0-01:30:00"], []),
    "a users script in a workdir, a mount": (
        {
            "command": ("python", "train.py", "--lr", "0.1"),
            "workdir": "/cluster/team/code",
            "mounts": ("/data:/data:ro",),
        },
        [
            "--bind /cluster/team/shared:/shared --bind /cluster/team/code:/workdir --bind /data:/data:ro "
            "--pwd /workdir",
            '"$sif" python train.py --lr 0.1',
        ],
        ["run_folder", "--run-dir"],  # a script of the user's decides where it writes
    ),
    "env and a value with spaces": (
        {"env": ("NCCL_DEBUG=INFO", "NOTE=two words; $(not run)")},
        ["export APPTAINERENV_NCCL_DEBUG=INFO", "export APPTAINERENV_NOTE='two words; $(not run)'"],
        ["APPTAINERENV_NCCL_DEBUG=WARN"],
    ),
    "a NIC by name": (
        {"network_interface": "ib0"},
        [
            "export APPTAINERENV_NCCL_SOCKET_IFNAME==ib0",
            "export APPTAINERENV_GLOO_SOCKET_IFNAME=ib0",
            "export APPTAINERENV_HOROVOD_GLOO_IFACE=ib0",
            "address=$(ip -4 -o addr show dev ib0 | awk '{split($4, a, \"/\"); print a[1]; exit}')",
        ],
        ["launcher.agent.rank_nic", "OMPI_MCA_btl", "getent"],
    ),
    "a NIC by subnet": (
        {"network_interface": "10.1.0.7/16"},
        [
            "python -m launcher.agent.rank_nic 10.1.0.0/16 --",
            """address=$(getent hosts "$(hostname)" | awk '{print $1; exit}')""",
        ],
        ["NCCL_SOCKET_IFNAME", "OMPI_MCA_btl"],
    ),
    "restarts": (
        {"max_restarts": 3},
        [
            "#SBATCH --requeue",
            "#SBATCH --open-mode=append",
            'if [ "${SLURM_RESTART_COUNT:-0}" -gt 3 ]; then',
            "  resume=(--resume)",
            'export APPTAINERENV_HOROVOD_STACK_RESTART="${SLURM_RESTART_COUNT:-0}"',
            'export APPTAINERENV_HOROVOD_STACK_CHECKPOINT_DIR=/shared/runs/horovod-stack-"${SLURM_JOB_ID}"/checkpoints',
            'export APPTAINERENV_HOROVOD_GLOO_TIMEOUT_SECONDS="${gloo_timeout}"',
            '${resume[@]+"${resume[@]}"}',
        ],
        ["--no-requeue"],
    ),
    "restarts, the user's own Gloo timeout": (
        {"max_restarts": 1, "env": ("HOROVOD_GLOO_TIMEOUT_SECONDS=900",)},
        ["export APPTAINERENV_HOROVOD_GLOO_TIMEOUT_SECONDS=900"],
        ['"${gloo_timeout}"'],
    ),
    "restarts of a users script": (
        {"max_restarts": 1, "command": ("python", "/cluster/team/code/train.py")},
        ['export APPTAINERENV_HOROVOD_STACK_CHECKPOINT_DIR=/shared/runs/horovod-stack-"${SLURM_JOB_ID}"/checkpoints'],
        ["--resume"],
    ),
    "timeline and autotune": (
        {"timeline": True, "autotune": True},
        [
            'export APPTAINERENV_HOROVOD_TIMELINE=/shared/runs/horovod-stack-"${SLURM_JOB_ID}"/timeline.json',
            "export APPTAINERENV_HOROVOD_AUTOTUNE=1",
        ],
        [],
    ),
    "a stall watch": (
        {"stall_timeout": 20},
        [
            "# --stall-timeout 20: when the job's output and its metrics file have not changed for 20 s,",
            '  while apptainer exec --cleanenv --bind /cluster/team/shared:/shared "$sif" python -m '
            'launcher.agent.batch_stall wait --ranks "$1" --timeout 20 --metrics '
            '/shared/runs/horovod-stack-"${SLURM_JOB_ID}"/metrics.jsonl --after "$after"; do',
            '      | apptainer exec --cleanenv "$sif" python -m launcher.agent.batch_stall report --timeout 20 || true',
            "    after=$(date +%s.%N)  # the next stall, after the job shows progress again",
            'stall_watch "$ranks" &',
            'exit "$status"',
        ],
        ["--fail", 'kill "$1"'],
    ),
    "a stall watch that fails the job, a users script": (
        {"stall_timeout": 600, "stall_action": "fail", "command": ("python", "train.py"), "workdir": "/code"},
        [
            '      | apptainer exec --cleanenv "$sif" python -m launcher.agent.batch_stall report --timeout 600 --fail '
            "|| true",
            '    kill "$1" 2>/dev/null || true  # the ranks end: the job FAILED',
        ],
        ["--metrics", "after=$(date"],
    ),
    "secrets by name": (
        {"secrets": ("WANDB_API_KEY", "HF_TOKEN")},
        ["for name in WANDB_API_KEY HF_TOKEN; do", '  export "APPTAINERENV_$name=${!name}"'],
        [],
    ),
}


@pytest.mark.parametrize("fields, present, absent", CASES.values(), ids=CASES.keys())
def test_the_script_says_what_each_option_asks_for_and_bash_reads_it(fields, present, absent):
    text = exported(**fields)
    assert text.startswith("#!/bin/bash\n")
    for line in present:
        assert line in text.splitlines() or line in srun_line(text), line
    for word in absent:
        assert word not in text, word
    assert srun_line(text).startswith("--mpi=none --kill-on-bad-exit=1 --cpu-bind=none --label bash -c")


def stand_ins(folder: Path) -> Path:
    """First on PATH: srun (runs its command once, as task 0 of 2 on node1), scontrol (the allocation's nodes, and a
    SlurmdTimeout of 10 s for `show config`), and apptainer, which writes what it was given into $RAN as JSON, or,
    asked to run the rendezvous server, into $RAN.server and prints the server's port (unless $NO_SERVER: it ends at
    once)."""
    folder.mkdir()
    tools = {
        "srun": "#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\n"
        "export SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_NTASKS=2 SLURM_NNODES=2 SLURM_NTASKS_PER_NODE=1\n"
        'SLURMD_NODENAME=node1 CUDA_VISIBLE_DEVICES=0 exec "$@"\n',
        "scontrol": '#!/bin/bash\nif [ "$2" = config ]; then echo "SlurmdTimeout           = 10 sec"; '
        "else echo node1; echo node2; fi\n",
        "apptainer": f"#!{sys.executable}\nimport json, os, sys, time\n"
        "env = {k[len('APPTAINERENV_'):]: v for k, v in os.environ.items() if k.startswith('APPTAINERENV_')}\n"
        "server = any('RendezvousServer' in word for word in sys.argv)\n"
        "json.dump({'argv': sys.argv[1:], 'env': env}, open(os.environ['RAN'] + ('.server' if server else ''), 'w'))\n"
        "if server and not os.environ.get('NO_SERVER'):\n    print(4242, flush=True); time.sleep(30)\n",
    }
    for name, text in tools.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def run_script(
    tmp_path: Path, extra_env: dict[str, str] | None = None, **fields
) -> tuple[subprocess.CompletedProcess, dict, dict]:
    """The exported script run by bash as Slurm would start it (job 42 on node1 and node2), with the stand-ins; what
    the rank's apptainer got, and what the rendezvous server's got."""
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    text = sbatch.script(request(shared=str(shared), **fields))
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    tools = tmp_path / "bin" if (tmp_path / "bin").exists() else stand_ins(tmp_path / "bin")
    ran = tmp_path / "ran.json"
    server = Path(f"{ran}.server")
    for old in (ran, server):
        old.unlink(missing_ok=True)
    env = {
        "PATH": f"{tools}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "RAN": str(ran),
        **(extra_env or {}),
    }
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    read = [json.loads(path.read_text()) if path.exists() else {} for path in (ran, server)]
    return done, read[0], read[1]


def test_every_rank_runs_the_trainer_in_the_sif_with_its_rank_and_the_rendezvous_server(tmp_path):
    done, given, server = run_script(tmp_path)
    assert done.returncode == 0, done.stderr
    shared = tmp_path / "shared"
    assert given["argv"] == [
        "exec",
        "--cleanenv",
        "--bind",
        f"{shared}:/shared",
        SIF,
        *job_command(TRAIN),
        "--run-dir",
        "/shared/runs/horovod-stack-42",
    ]
    env = given["env"]
    assert env["OMPI_MCA_mpi_yield_when_idle"] == "1" and env["NCCL_DEBUG"] == "WARN"
    ranks = {key: env[key] for key in env if key.startswith("HOROVOD_") and key.endswith(("RANK", "SIZE", "NAME"))}
    assert ranks == {
        "HOROVOD_RANK": "0",
        "HOROVOD_SIZE": "2",
        "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "1",
        "HOROVOD_CROSS_RANK": "0",
        "HOROVOD_CROSS_SIZE": "2",
        "HOROVOD_HOSTNAME": "node1",
    }
    assert (env["HOROVOD_CONTROLLER"], env["HOROVOD_CPU_OPERATIONS"]) == ("gloo", "gloo")
    assert env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "4242"
    assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == server["env"]["RENDEZVOUS_ADDRESS"] != ""
    assert (env["SLURM_PROCID"], env["CUDA_VISIBLE_DEVICES"]) == ("0", "0")  # past --cleanenv
    assert server["argv"][:3] == ["exec", "--cleanenv", SIF]
    assert (server["env"]["RENDEZVOUS_HOSTS"], server["env"]["RENDEZVOUS_RANKS"]) == ("node1:1,node2:1", "2")
    token = env["HOROVOD_STACK_RENDEZVOUS_TOKEN"]
    assert len(token) >= 32 and server["env"]["HOROVOD_STACK_RENDEZVOUS_TOKEN"] == token
    assert token not in " ".join([*given["argv"], *server["argv"]])
    assert (shared / "runs" / "horovod-stack-42").is_dir()
    assert f"run folder: {shared}/runs/horovod-stack-42" in done.stdout


def test_a_rendezvous_server_that_does_not_start_ends_the_job_at_once_in_one_line(tmp_path):
    done, given, _ = run_script(tmp_path, {"NO_SERVER": "1"})
    assert done.returncode == 1 and given == {}
    assert done.stderr.splitlines() == [
        f"error: Horovod's rendezvous server did not start on {os.uname().nodename} (waited up to 60 s): run "
        f"apptainer exec {SIF} python -c 'import horovod' there to see why"
    ]


def test_a_secret_reaches_the_ranks_from_the_submitting_environment_and_is_never_in_the_script(tmp_path):
    done, given, _ = run_script(tmp_path, {"WANDB_API_KEY": SECRET_VALUE}, secrets=("WANDB_API_KEY",))
    assert done.returncode == 0, done.stderr
    assert given["env"]["WANDB_API_KEY"] == SECRET_VALUE
    assert SECRET_VALUE not in (tmp_path / "job.sbatch").read_text()
    assert SECRET_VALUE not in " ".join(given["argv"])
    done, given, _ = run_script(tmp_path, secrets=("WANDB_API_KEY",))
    assert done.returncode == 2 and given == {}
    assert done.stderr.splitlines() == [
        "error: secret WANDB_API_KEY is not set: export WANDB_API_KEY in the shell that runs sbatch, then submit again"
    ]


def test_a_requeued_job_resumes_from_its_checkpoint_and_stops_past_max_restarts(tmp_path):
    done, given, _ = run_script(tmp_path, max_restarts=2)
    assert done.returncode == 0, done.stderr
    assert "--resume" not in given["argv"] and given["env"]["HOROVOD_STACK_RESTART"] == "0"
    assert given["env"]["HOROVOD_STACK_CHECKPOINT_DIR"] == "/shared/runs/horovod-stack-42/checkpoints"
    # Twice the site's SlurmdTimeout (10 s here) and a minute: the ranks outwait Slurm's verdict on a lost node.
    assert given["env"]["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "80"
    done, given, _ = run_script(tmp_path, {"SLURM_RESTART_COUNT": "2"}, max_restarts=2)
    assert done.returncode == 0, done.stderr
    assert given["argv"][-3:] == ["--run-dir", "/shared/runs/horovod-stack-42", "--resume"]
    assert given["env"]["HOROVOD_STACK_RESTART"] == "2"
    assert "restart 2/2: resuming from the newest checkpoint" in done.stdout
    done, given, _ = run_script(tmp_path, {"SLURM_RESTART_COUNT": "3"}, max_restarts=2)
    assert done.returncode == 1 and given == {}
    assert done.stderr.splitlines() == ["error: Slurm requeued the job 3 times, past --max-restarts 2: not run again"]


def test_a_users_script_runs_in_its_workdir_with_its_own_env(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    done, given, _ = run_script(
        tmp_path, command=("python", "train.py"), workdir=str(code), env=("A=1",), gpus_per_node=2
    )
    assert done.returncode == 0, done.stderr
    assert given["argv"][:2] == ["exec", "--cleanenv"] and "--nv" in given["argv"]
    assert given["argv"][-5:] == ["--pwd", "/workdir", SIF, "python", "train.py"]
    assert f"{code}:/workdir" in given["argv"]
    assert given["env"]["A"] == "1" and given["env"]["HOROVOD_STACK_GPUS"] == "1"


def test_no_stall_watch_unless_asked_for():
    assert "stall_watch" not in exported() and exported().rstrip().endswith(
        '--run-dir /shared/runs/horovod-stack-"${SLURM_JOB_ID}"'
    )


HANG = "import sys, time\nprint('rank started', flush=True)\ntime.sleep(float(sys.argv[1]))\n"
STALL_STAND_INS = {
    "apptainer": "#!/bin/bash\n# Runs its command with the APPTAINERENV_ variables alone, as --cleanenv leaves them.\n"
    "shift\nwhile [[ $1 == --* ]]; do case $1 in --bind | --pwd) shift 2 ;; *) shift ;; esac; done\nshift\n"
    "if [[ $* == *RendezvousServer* ]]; then echo 4242; exec sleep 30; fi\ngiven=()\n"
    'for name in ${!APPTAINERENV_@}; do given+=("${name#APPTAINERENV_}=${!name}"); done\n'
    'exec env -i PATH="$STAND_INS" PYTHONPATH="$REPO" "${given[@]}" "$@"\n',
    "py-spy": "#!/bin/bash\n# A dump of process $4 (dump --json --pid PID) hung in hang_here.\n"
    """echo '[{"os_thread_id": '$4', "frames": [{"name": "hang_here", "filename": "/code/hang.py", "line": 3}]}]'\n""",
}


@pytest.mark.parametrize("action", ["warn", "fail"])
def test_a_stalled_job_prints_every_ranks_stack_once_and_fail_ends_it(tmp_path, action):
    tools = stand_ins(tmp_path / "bin")
    for name, text in STALL_STAND_INS.items():
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    (tools / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # not a link: a venv's python
    (tools / "python").chmod(0o755)  # finds its packages only when started by its own path
    (tmp_path / "hang.py").write_text(HANG)
    seconds = "6" if action == "warn" else "60"
    command = ("python", str(tmp_path / "hang.py"), seconds)
    paths = f"{tools}:{Path(sys.executable).parent}:/usr/bin:/bin"
    env = {"STAND_INS": paths, "REPO": str(Path(__file__).parents[1]), "SLURM_JOB_NUM_NODES": "2"}
    output = tmp_path / "job.out"
    with output.open("w") as out:
        shared = tmp_path / "shared"
        shared.mkdir()
        text = sbatch.script(request(shared=str(shared), command=command, stall_timeout=2, stall_action=action))
        (tmp_path / "job.sbatch").write_text(text)
        done = subprocess.run(
            ["bash", str(tmp_path / "job.sbatch")],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={"PATH": paths, "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-2]", "RAN": "/dev/null", **env},
            timeout=60,
        )
    said = output.read_text()
    assert said.count("the job looks stalled: no output and no new metrics for ") == 1, said
    assert "s (stall timeout 2 s); every rank's stack:\nrank 0 (node1 pid " in said
    assert "in hang_here at hang.py:3\n    hang_here (/code/hang.py:3)\n" in said
    if action == "warn":
        assert done.returncode == 0, said
    else:
        assert done.returncode == 143, said
        assert said.rstrip().endswith("in hang_here at hang.py:3; ending the job (stall action fail)"), said


def test_every_start_flag_is_either_taken_or_refused():
    taken = {spelling for row in export_flags.SBATCH for spelling in (row.flag, *row.spellings)}
    undecided = [
        row.flag for row in flags.FLAGS if row.flag not in taken and row.flag not in sbatch_request.NOT_ON_SLURM
    ]
    assert undecided == []
    assert not taken & set(sbatch_request.NOT_ON_SLURM)


BAD = {
    "node names": ({"nodes": "node_1,node_2"}, "--nodes 'node_1,node_2': Slurm picks an allocation's nodes"),
    "no nodes": ({"nodes": "0"}, "--nodes 0: a job needs at least 1 node"),
    "no SIF": ({"sif": None}, "no SIF: pass --sif FILE.sif (or SIF in .env); apptainer build FILE.sif"),
    "relative SIF": ({"sif": "hs.sif"}, "--sif 'hs.sif' is not an absolute path"),
    "no shared folder": ({"shared": None}, "no shared folder: pass --shared DIR (or SLURM_SHARED_DIR in .env)"),
    "a colon in a bind": ({"shared": "/a:b"}, "--shared '/a:b' holds ':', ',' or a line break"),
    "workdir relative": ({"workdir": "code"}, "--workdir 'code' is not an absolute path"),
    "job name": ({"name": "my job"}, "--name 'my job' is not a job name this script takes"),
    "partition": ({"partition": "gpu\n#SBATCH --x"}, "is not a Slurm partition name"),
    "time": ({"time": "two hours"}, "--time 'two hours' is not a Slurm time"),
    "both times": ({"time": "10", "time_limit": 60}, "--time and --time-limit both give the time limit"),
    "slots and gpus": ({"slots": 2, "gpus_per_node": 4}, "--slots 2 with --gpus-per-node 4: a GPU worker runs one"),
    "env": ({"env": ("NOPE",)}, "--env 'NOPE' is not KEY=VALUE"),
    "secret in env": ({"secrets": ("TOKEN",), "env": ("TOKEN=x",)}, "TOKEN is both a secret"),
}


@pytest.mark.parametrize("fields, message", BAD.values(), ids=BAD.keys())
def test_bad_input_is_refused_naming_the_fix(fields, message):
    with pytest.raises(SettingsError) as raised:
        request(**fields)
    assert any(message in problem for problem in raised.value.problems), raised.value.problems


@pytest.mark.parametrize(
    "text, seconds",
    [("90", 5400), ("5:30", 330), ("2:00:00", 7200), ("1-0", 86400), ("1-2:30", 95400), ("0-0:0:59", 59), ("x", None)],
)
def test_slurms_time_formats(text, seconds):
    assert sbatch_request.slurm_seconds(text) == seconds
    if seconds:
        assert sbatch_request.slurm_seconds(sbatch.slurm_time(seconds)) == seconds


LAUNCH = ["export", "sbatch", "--nodes", "2", "--sif", SIF, "--shared", SHARED]


def refused_words(row: flags.Flag) -> list[str]:
    return [row.flag] if row.kind is bool else [row.flag, "1" if row.kind is int else "x"]


@pytest.mark.parametrize("flag", sorted(sbatch_request.NOT_ON_SLURM))
def test_each_start_option_without_meaning_on_slurm_is_refused_in_one_line(tmp_path, flag):
    row = next(row for row in flags.FLAGS if row.flag == flag)
    out = tmp_path / "job.sbatch"
    result = CliRunner().invoke(app, [*LAUNCH, *refused_words(row), "-o", str(out)])
    assert result.exit_code == 2
    assert result.output.splitlines() == [f"error: {sbatch_request.refusal(flag)}"]
    assert not out.exists()


def test_the_cli_writes_the_script_and_takes_the_sif_and_shared_folder_from_env(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [*LAUNCH, "--", *TRAIN])
    assert result.exit_code == 0, result.output
    assert result.stdout == sbatch.script(request())
    (tmp_path / ".env").write_text(f"SIF=images/hs.sif\nSLURM_SHARED_DIR={SHARED}\n")
    out = tmp_path / "job.sbatch"
    result = CliRunner().invoke(app, ["export", "sbatch", "--nodes", "1", "--secret", "HF_TOKEN", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "the secrets (HF_TOKEN) come from the environment sbatch runs in" in result.output
    text = out.read_text()
    assert f"sif={tmp_path}/images/hs.sif" in text and f"--bind {SHARED}:/shared" in text
    assert stat.S_IMODE(out.stat().st_mode) & 0o077 in (0, 0o044)  # no secret in it: readable is fine


def test_export_lists_both_kinds():
    result = CliRunner().invoke(app, ["export", "--help"])
    assert result.exit_code == 0
    assert "mpijob" in result.output and "sbatch" in result.output
