"""scripts/gpu-check-tensorflow.sh (horovod-stack:tensorflow on a GPU host) and its container half,
scripts/gpu_check_tensorflow.py, without a GPU or Docker: the script against stand-ins of nvidia-smi and docker (no
GPU: one line and exit 0; no engine or image: the fix and a non-zero exit; the steps' verdicts into one line), the
judging of NCCL's INFO lines, Horovod's timeline and the trainer's output as tables, and the container half's launch
with a stand-in mpirun. The real run needs a GPU host with the image: the integration test at the end."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu-check-tensorflow.sh"
CHECK_FILE = REPO / "scripts" / "gpu_check_tensorflow.py"
_spec = importlib.util.spec_from_file_location("gpu_check_tensorflow", CHECK_FILE)
assert _spec is not None and _spec.loader is not None
check = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = check  # its dataclass looks its module up
_spec.loader.exec_module(check)

HOST_TOOLS = ("dirname", "grep", "sed", "head", "tail", "cut", "tee", "mkdir", "rm", "chmod", "timeout", "cat")
"""What the script runs besides nvidia-smi and docker: linked into the stand-in PATH, which holds nothing else."""
GPU_LIST = "GPU {0}: NVIDIA H100 80GB HBM3 (UUID: GPU-0000000{0}-aaaa-bbbb-cccc-dddddddddddd)"
NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
NO_TOOLKIT = 'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].'

# The stand-in docker: records each call; FAKE_* choose its answers. `docker run ... python CHECK STEP ...` prints
# the step's verdict line as scripts/gpu_check_tensorflow.py would.
DOCKER = r"""#!/bin/sh
echo "$*" >> "$CALLS"
case "$1" in
  info) [ "${FAKE_ENGINE:-up}" = up ] || { echo 'Cannot connect to the Docker daemon.' >&2; exit 1; } ;;
  image) [ "${FAKE_IMAGE:-present}" = present ] || { echo 'Error: No such image' >&2; exit 1; } ;;
  run)
    case "$*" in
      *nvidia-smi*)
        [ "${FAKE_TOOLKIT:-yes}" = yes ] || { echo "$NO_TOOLKIT" >&2; echo "See 'docker run --help'." >&2; exit 125; }
        printf '%s\n' "$GPU_LINES" ;;
      *" allreduce "*) echo 'gpu-host:1:2 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 - Init COMPLETE'
                       echo "allreduce-check: ${FAKE_ALLREDUCE:-PASS sums exact} (9 s)" ;;
      *" trainer "*) echo '12:00:00 [rank 0] plan: 2 ranks on cuda, dataset digits'
                     [ "${FAKE_TRAINER:-PASS}" != silent ] || exit 137
                     echo "trainer-check: ${FAKE_TRAINER:-PASS trained} (20 s)" ;;
    esac ;;
esac
"""


def stand_ins(tmp_path: Path, nvidia_smi: str | None, docker: bool = True, gpus: int = 2, **fake: str) -> dict:
    """The script's environment: a PATH of the host tools and the given stand-ins only; the docker stand-in's
    calls go to tmp_path/calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in HOST_TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    if nvidia_smi is not None:
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{nvidia_smi}\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    if docker:
        (bin_dir / "docker").write_text(DOCKER)
        (bin_dir / "docker").chmod(0o755)
    gpu_lines = "\n".join(GPU_LIST.format(index) for index in range(gpus))
    return {
        "PATH": str(bin_dir),
        "CALLS": str(tmp_path / "calls"),
        "OUT": str(tmp_path / "out"),
        "GPU_LINES": gpu_lines,
        "NO_TOOLKIT": NO_TOOLKIT,
        **{f"FAKE_{key.upper()}": value for key, value in fake.items()},
    }


def run_script(env: dict, *args: str) -> subprocess.CompletedProcess:
    bash = shutil.which("bash")
    assert bash
    return subprocess.run([bash, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


def docker_calls(tmp_path: Path) -> list[str]:
    calls = tmp_path / "calls"
    return calls.read_text().splitlines() if calls.exists() else []


def lists(gpus: int) -> str:
    return "echo '" + "\n".join(GPU_LIST.format(index) for index in range(gpus)) + "'"


# --- the script ---------------------------------------------------------------------------------------------------
def test_help_prints_the_header_comment():
    done = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    header = SCRIPT.read_text().split("\nset -euo pipefail")[0].splitlines()[1:]
    assert done.stdout.splitlines() == [line[2:] if line.startswith("# ") else line.lstrip("#") for line in header]
    assert "NCCL_DEBUG=INFO" in done.stdout and "--gpus all" in done.stdout and "exits 0" in done.stdout


def test_an_unknown_argument_is_refused_in_one_line():
    done = subprocess.run([str(SCRIPT), "--cpu"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr == "gpu-check-tensorflow: unknown argument --cpu (--help)\n"


@pytest.mark.parametrize(
    ("nvidia_smi", "line"),
    [
        (None, "gpu-check-tensorflow: no GPU here (no nvidia-smi): nothing checked"),
        (
            f'echo "{NO_DRIVER}"; exit 9',
            f"gpu-check-tensorflow: no GPU here (nvidia-smi -L: {NO_DRIVER}): nothing checked",
        ),
        ("exit 0", "gpu-check-tensorflow: no GPU here (nvidia-smi -L: ): nothing checked"),
    ],
    ids=["no nvidia-smi", "nvidia-smi without a driver", "nvidia-smi lists none"],
)
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0_having_checked_nothing(tmp_path, nvidia_smi, line):
    done = run_script(stand_ins(tmp_path, nvidia_smi))
    assert (done.returncode, done.stdout, done.stderr) == (0, line + "\n", "")
    assert docker_calls(tmp_path) == []
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("setting", "calls", "fix"),
    [
        (
            {"docker": False},
            0,
            "failed: docker: not installed; install Docker (https://docs.docker.com/engine/install/)",
        ),
        ({"engine": "down"}, 1, "failed: docker: no engine answers (Cannot connect to the Docker daemon.); start it"),
        (
            {"image": "missing"},
            2,
            "failed: image: no horovod-stack:tensorflow here; build it with scripts/build-images.sh",
        ),
        ({"toolkit": "no"}, 3, "failed: gpus: nvidia-smi lists 2 GPU(s) here, but a container of horovod-stack:"),
    ],
    ids=["no docker", "no engine", "no image", "no container toolkit"],
)
def test_what_it_cannot_run_without_is_named_with_its_fix_in_one_line(tmp_path, setting, calls, fix):
    done = run_script(stand_ins(tmp_path, lists(2), **setting))
    assert done.returncode == 2
    assert len(done.stdout.splitlines()) == 1 and done.stderr == ""
    assert done.stdout.startswith(f"gpu-check-tensorflow: {fix}"), done.stdout
    assert len(docker_calls(tmp_path)) == calls
    if setting == {"toolkit": "no"}:
        assert NO_TOOLKIT in done.stdout and "NVIDIA Container Toolkit" in done.stdout


@pytest.mark.parametrize(("gpus", "ranks"), [(1, 1), (2, 2), (8, 2)])
def test_each_step_runs_in_one_container_with_every_gpu_and_one_rank_per_gpu_up_to_two(tmp_path, gpus, ranks):
    done = run_script(stand_ins(tmp_path, lists(gpus), gpus=gpus))
    assert done.returncode == 0, done.stdout + done.stderr
    last = done.stdout.splitlines()[-1]
    alone = "" if ranks == 2 else " (one GPU: no data crossed between GPUs)"
    assert last.startswith(
        "gpu-check-tensorflow: passed: NCCL allreduce through TensorFlow and the Keras trainer "
        f"on {ranks} rank(s){alone}, {gpus} GPU(s) (NVIDIA H100 80GB HBM3), parameters identical on every rank"
    )
    runs = [call for call in docker_calls(tmp_path) if call.startswith("run ")]
    assert runs[0] == "run --rm --gpus all horovod-stack:tensorflow nvidia-smi -L"
    for run, step in zip(runs[1:], ("allreduce", "trainer"), strict=True):
        assert run.startswith("run --rm --init --gpus all --shm-size 1g --ulimit memlock=-1 ")
        assert f"/scripts/gpu_check_tensorflow.py:/opt/gpu-check/gpu_check_tensorflow.py:ro -v {tmp_path}/out" in run
        assert run.endswith(f"python /opt/gpu-check/gpu_check_tensorflow.py {step} --ranks {ranks} --out /out "
                            "--timeout 300")  # fmt: skip
    assert ("one GPU: NCCL takes one rank per GPU" in done.stdout) == (gpus == 1)
    assert "allreduce-check: PASS sums exact" in done.stdout and "plan: 2 ranks on cuda" in done.stdout
    log = (tmp_path / "out" / "gpu-check-tensorflow.log").read_text()
    assert log.splitlines()[-1] == last
    assert (tmp_path / "out" / "allreduce.log").read_text().endswith("allreduce-check: PASS sums exact (9 s)\n")
    assert oct((tmp_path / "out" / "container").stat().st_mode & 0o777) == "0o777"


def test_a_failed_step_is_named_in_the_last_line_and_the_other_step_still_runs(tmp_path):
    env = stand_ins(tmp_path, lists(2), allreduce="FAIL Horovod's timeline shows MPI_ALLREDUCE, not NCCL_ALLREDUCE")
    done = run_script(env)
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == (
        "gpu-check-tensorflow: failed: allreduce: Horovod's timeline shows MPI_ALLREDUCE, not NCCL_ALLREDUCE (9 s)"
    )
    assert "trainer-check: PASS trained" in done.stdout


def test_a_container_that_ends_without_a_verdict_fails_its_step(tmp_path):
    done = run_script(stand_ins(tmp_path, lists(2), trainer="silent"))
    assert done.returncode == 1
    last = done.stdout.splitlines()[-1]
    assert last.startswith("gpu-check-tensorflow: failed: trainer: no verdict from the container, and docker run "
                           f"exited 137 ({tmp_path}/out/trainer.log)")  # fmt: skip


# --- NCCL's lines -------------------------------------------------------------------------------------------------
NEW = "gpu-host:{pid}:{tid} [{rank}] NCCL INFO ncclCommInitRank comm 0x5e303a52bd7{rank} rank {rank} nranks {size} "
NEW += "cudaDev {rank} nvmlDev {rank} busId {rank}8000 commId 0xadcb40d61cc1bc4b - Init {what}"
OLD = "node01:3384:3414 [{rank}] NCCL INFO comm 0x7fe3d400198{rank} rank {rank} nranks {size} cudaDev {rank} nvmlDev "
OLD += "{rank} - Init COMPLETE"
RANKED = "h:1:2 [{rank}] NCCL INFO [Rank {rank}] ncclCommInitRankConfig comm 0x5e{rank} rank {rank} nranks 2 "
RANKED += "cudaDev {rank} nvmlDev {rank} busId 18000 commId 0x1 localSize 2 used 3 bytes - Init COMPLETE"
VERSION = "gpu-host:10:11 [0] NCCL INFO NCCL version 2.27.7+cuda12.9"
CHANNEL = "gpu-host:10:12 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"


def new(rank: int, size: int, what: str = "COMPLETE", tag: str = "") -> str:
    return tag + NEW.format(pid=10 + rank, tid=20 + rank, rank=rank, size=size, what=what)


@pytest.mark.parametrize(
    ("lines", "ranks", "ok", "says"),
    [
        ([VERSION, new(0, 2, "START"), new(1, 2, "START"), CHANNEL, new(0, 2), new(1, 2)], 2, True,
         "NCCL 2.27.7+cuda12.9: a communicator of 2 rank(s) 'Init COMPLETE' on every rank, channels via P2P/CUMEM"),
        ([new(0, 2, tag="[1,0]<stdout>:"), new(1, 2, tag="[1,1]<stdout>:")], 2, True, "(version not printed)"),
        ([RANKED.format(rank=0), RANKED.format(rank=1)], 2, True, "a communicator of 2 rank(s) 'Init COMPLETE'"),
        ([OLD.format(rank=0, size=1)], 1, True, "a communicator of 1 rank(s) 'Init COMPLETE'"),
        (["h:1:2 [0] NCCL INFO comm 0x1a rank 0 nranks 2 cudaDev 0", "h:3:4 [1] NCCL INFO comm 0x1b rank 1 nranks 2"],
         2, True, "a communicator of 2 rank(s)"),
        ([new(0, 2), new(1, 2, "START")], 2, False, "of 2 rank(s) on rank(s) [1] (seen: rank 0 of 2)"),
        ([new(0, 1), new(0, 1)], 2, False, "on rank(s) [0, 1] (seen: rank 0 of 1)"),
        ([new(0, 2, "START"), new(1, 2, "START"), "h:1:2 [1] NCCL WARN Cuda failure 'out of memory'"], 2, False,
         "NCCL started a communicator but no rank says 'Init COMPLETE'; NCCL WARN Cuda failure 'out of memory'"),
        (["epoch 1/3: train loss 0.5"], 2, False, "no 'NCCL INFO' line: NCCL did not start"),
        ([], 1, False, "no 'NCCL INFO' line"),
    ],
    ids=["NCCL 2.2x, 2 ranks", "mpirun's rank tags", "[Rank N] first", "NCCL 2.4, 1 rank", "no Init words",
         "one rank not complete", "each rank alone", "init never completes", "no NCCL lines", "no output"],
)  # fmt: skip
def test_nccl_carried_it_only_when_every_rank_completed_a_communicator_of_all_ranks(lines, ranks, ok, says):
    verdict = check.nccl_evidence("\n".join(lines) + "\n", ranks)
    assert verdict.ok is ok
    assert says in verdict.text


@pytest.mark.parametrize(
    ("text", "ops"),
    [
        ('{"name": "NEGOTIATE_ALLREDUCE", "ph": "B"}, {"name": "NCCL_ALLREDUCE", "ph": "B"}',
         ["NCCL_ALLREDUCE", "NEGOTIATE_ALLREDUCE"]),
        ('{"name": "MPI_ALLREDUCE"}, {"name": "MEMCPY_IN_FUSION_BUFFER"}', ["MPI_ALLREDUCE"]),
        ("", []),
    ],
)  # fmt: skip
def test_the_timeline_names_the_allreduce_horovod_ran(text, ops):
    assert check.timeline_allreduces(text) == ops


@pytest.mark.parametrize(("code", "release"), [(23207, "2.32.7"), (22105, "2.21.5"), (2804, "2.8.4")])
def test_nccl_built_reads_as_a_release(code, release):
    assert check.nccl_release(code) == release


# --- the steps' verdicts ------------------------------------------------------------------------------------------
NCCL_2 = "\n".join([VERSION, new(0, 2), new(1, 2), CHANNEL])
VALUES = {"ranks": 2, "sizes": "1000,1048576", "nccl_built": 22705, "device_name": "NVIDIA H100 80GB HBM3",
          "largest_mb": 4.19, "allreduce_ms": 0.12, "busbw_gb_s": 35.0, "problems": []}  # fmt: skip
TIMELINE = '[{"name": "NCCL_ALLREDUCE", "ph": "B"}'


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({}, None),
        ({"values": {**VALUES, "problems": ["sum of 1000 floats: 3 element(s) wrong (expected 3 x pattern)"]}},
         "sum of 1000 floats: 3 element(s) wrong"),
        ({"values": {**VALUES, "nccl_built": 0}}, "this image's Horovod has no NCCL ops (hvd.nccl_built() is 0)"),
        ({"values": {**VALUES, "ranks": 1}}, "Horovod started 1 rank(s), not 2"),
        ({"values": None, "rc": 1, "output": NCCL_2 + "\nRuntimeError: Horovod has been shut down\n"},
         "the ranks exited with status 1 (RuntimeError: Horovod has been shut down); rank 0 wrote no result"),
        ({"rc": None}, "timed out after 300 s"),
        ({"output": "rank 0: done\n"}, "no 'NCCL INFO' line"),
        ({"timeline": '{"name": "MPI_ALLREDUCE"}'}, "Horovod's timeline shows MPI_ALLREDUCE, not NCCL_ALLREDUCE"),
        ({"timeline": None}, "Horovod's timeline shows no allreduce, not NCCL_ALLREDUCE"),
    ],
    ids=["passes", "a wrong sum", "no NCCL ops", "one rank", "a rank died", "timed out", "no NCCL lines",
         "MPI carried it", "no timeline"],
)  # fmt: skip
def test_the_allreduce_passes_only_with_exact_values_nccl_built_its_lines_and_its_timeline(change, says):
    given = {"rc": 0, "output": NCCL_2, "values": VALUES, "timeline": TIMELINE, **change}
    verdict = check.judge_allreduce(given["rc"], 300, given["output"], given["values"], given["timeline"], 2)
    assert verdict.ok is (says is None), verdict.text
    if says is None:
        assert verdict.text.startswith(
            "2 rank(s) on NVIDIA H100 80GB HBM3: sums and averages of GPU tensors of 1000,1048576 floats exact; "
            "Horovod built with NCCL 2.27.5; NCCL 2.27.7"
        )
        assert verdict.text.endswith("NCCL_ALLREDUCE in Horovod's timeline; 4.19 MB in 0.12 ms, busbw 35.0 GB/s")
    else:
        assert says in verdict.text


DIGEST = "ab12cd34ef56" + "0" * 52
TRAINED = "\n".join([
    "12:00:01 [rank 0] plan: 2 ranks on cuda, dataset digits (1437 train / 360 val), epochs 1-3, batch 32 per rank",
    NCCL_2,
    "12:00:09 [rank 0] epoch 3/3: train loss 0.2100, val loss 0.2500, val accuracy 0.9300, 900 samples/s, 1.0 s",
    f"12:00:10 [rank 0] parameters identical on all 2 ranks (sha256 {DIGEST[:12]}...)",
])  # fmt: skip
SUMMARY = {"world_size": 2, "ranks": [{"rank": 0, "digest": DIGEST}, {"rank": 1, "digest": DIGEST}]}
METRICS = [{"epoch": epoch, "val_accuracy": 0.8 + epoch / 100} for epoch in (1, 2, 3)]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({}, None),
        ({"output": TRAINED.replace("on cuda", "on cpu")}, "the plan line says 2 ranks on cpu, not 2 on cuda"),
        ({"summary": {**SUMMARY, "ranks": [{"digest": DIGEST}, {"digest": "f" * 64}]}},
         "summary.json holds 2 different parameter digests"),
        ({"summary": {"world_size": 1, "ranks": [{"digest": DIGEST}]}}, "summary.json holds 1 rank(s), not 2"),
        ({"summary": None}, "no summary.json"),
        ({"output": TRAINED.replace(DIGEST[:12], "999999999999")}, "summary.json's digest is not the one the trainer"),
        ({"output": TRAINED.replace("parameters identical", "x")}, "no 'parameters identical on all N ranks' line"),
        ({"metrics": METRICS[:2]}, "metrics.jsonl holds epochs [1, 2], not 1-3"),
        ({"metrics": [{**record, "val_accuracy": 0.2} for record in METRICS]}, "validation accuracy 0.200"),
        ({"output": TRAINED.replace(NCCL_2, "")}, "the gradients' allreduce: no 'NCCL INFO' line"),
        ({"rc": 2, "output": "error: GPUs were asked for but CUDA is not available to this rank: update the driver"},
         "the ranks exited with status 2 (error: GPUs were asked for but CUDA is not available to this rank"),
    ],
    ids=["passes", "on the CPU", "ranks differ", "one rank", "no summary", "another digest", "no identical line",
         "an epoch short", "did not learn", "no NCCL lines", "no CUDA"],
)  # fmt: skip
def test_the_trainer_passes_only_on_cuda_with_every_epoch_and_identical_parameters(change, says):
    given = {"rc": 0, "output": TRAINED, "summary": SUMMARY, "metrics": METRICS, **change}
    verdict = check.judge_trainer(given["rc"], 300, given["output"], given["summary"], given["metrics"], 2)
    assert verdict.ok is (says is None), verdict.text
    if says is None:
        assert verdict.text.startswith("2 rank(s) on cuda, 3 epochs of digits, validation accuracy 0.830, parameters "
                                       "identical on all 2 ranks (sha256 ab12cd34ef56..., summary.json agrees); "
                                       "gradients averaged by NCCL 2.27.7")  # fmt: skip
    else:
        assert says in verdict.text


def test_one_rank_trains_without_nccl_lines_since_horovod_skips_the_gradients_allreduce_there():
    output = TRAINED.replace(NCCL_2, "").replace("2 ranks", "1 ranks")
    summary = {"world_size": 1, "ranks": [{"digest": DIGEST}]}
    verdict = check.judge_trainer(0, 300, output, summary, METRICS, 1)
    assert verdict.ok, verdict.text
    assert verdict.text.endswith("; 1 rank: no gradient allreduce")


@pytest.mark.parametrize(
    ("root", "argv"),
    [
        (False, ["mpirun", "-np", "2", "-bind-to", "none", "-map-by", "slot", "-x", "NCCL_DEBUG"]),
        (
            True,
            ["mpirun", "--allow-run-as-root", "-np", "2", "-bind-to", "none", "-map-by", "slot", "-x", "NCCL_DEBUG"],
        ),
    ],
)
def test_mpirun_runs_as_root_only_when_allowed_to(root, argv):
    assert check.mpirun_argv(2, ["NCCL_DEBUG"], root) == argv


# --- the container's side, with a stand-in mpirun -----------------------------------------------------------------
# Started as the container half starts mpirun: checks the environment the ranks get, prints NCCL's lines and writes
# what rank 0 (allreduce) or the trainer would.
MPIRUN = """
import json, os, sys, time
args = sys.argv[1:]
size = int(args[args.index("-np") + 1])
if os.environ.get("FAKE_MPIRUN") == "hang":
    time.sleep(60)
assert os.environ["NCCL_DEBUG"] == "INFO" and ["-x", "NCCL_DEBUG"] == args[args.index("NCCL_DEBUG") - 1:][:2]
for rank in range(size):
    print(f"h:{rank}:1 [{rank}] NCCL INFO comm 0x{rank} rank {rank} nranks {size} cudaDev {rank} - Init COMPLETE")
if "rank" in args:
    assert args[-3:-1] == ["rank", "--json"], args
    values = {"ranks": size, "sizes": "1000", "nccl_built": 22705, "device_name": "GPU", "problems": []}
    open(args[-1], "w").write(json.dumps(values))
    open(os.environ["HOROVOD_TIMELINE"], "w").write('[{"name": "NCCL_ALLREDUCE"}')
else:
    assert os.environ["HOROVOD_STACK_GPUS"] == "1" and args[args.index("-m") + 1] == "app.train", args
    digest = "c" * 64
    open(args[args.index("--summary-file") + 1], "w").write(json.dumps(
        {"world_size": size, "ranks": [{"digest": digest}] * size}))
    open(args[args.index("--metrics-file") + 1], "w").write(
        "".join(json.dumps({"epoch": epoch, "val_accuracy": 0.9}) + "\\n" for epoch in (1, 2, 3)))
    print(f"[rank 0] plan: {size} ranks on cuda, dataset digits")
    print(f"[rank 0] parameters identical on all {size} ranks (sha256 {digest[:12]}...)")
"""


def container_half(tmp_path: Path, step: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "mpirun").write_text(f"#!{sys.executable}\n{MPIRUN}")
    (bin_dir / "mpirun").chmod(0o755)
    argv = [sys.executable, str(CHECK_FILE), step, "--ranks", "2", "--out", str(tmp_path / "out")]
    environ = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env}
    return subprocess.run(argv + ["--timeout", str(timeout)], env=environ, capture_output=True, text=True, timeout=90)


@pytest.mark.parametrize("step", ["allreduce", "trainer"])
def test_the_container_half_starts_mpirun_and_ends_with_its_verdict(tmp_path, step):
    done = container_half(tmp_path, step)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("+ mpirun ")
    last = done.stdout.splitlines()[-1]
    assert last.startswith(f"{step}-check: PASS 2 rank(s) on ")
    assert "a communicator of 2 rank(s) 'Init COMPLETE' on every rank" in last


def test_the_container_half_stops_mpirun_at_its_limit_and_fails(tmp_path):
    done = container_half(tmp_path, "allreduce", timeout=1, FAKE_MPIRUN="hang")
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1].startswith("allreduce-check: FAIL timed out after 1 s; rank 0 wrote no result")


# --- the real thing -----------------------------------------------------------------------------------------------
@pytest.mark.integration
def test_on_this_host_it_passes_on_its_gpus_or_says_in_one_line_that_there_are_none(tmp_path):
    """A host without a GPU (this project's test machines): the one line, exit 0. A GPU host with Docker, the NVIDIA
    Container Toolkit and horovod-stack:tensorflow: both steps pass."""
    done = subprocess.run([str(SCRIPT)], env={**os.environ, "OUT": str(tmp_path)}, capture_output=True, text=True,
                          timeout=1500)  # fmt: skip
    if shutil.which("nvidia-smi") is None:
        assert (done.returncode, done.stdout) == (
            0,
            "gpu-check-tensorflow: no GPU here (no nvidia-smi): nothing checked\n",
        )
        return
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    assert done.stdout.splitlines()[-1].startswith("gpu-check-tensorflow: passed: ")
