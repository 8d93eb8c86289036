"""Settings are refused before training starts, each with one line that names the flag."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app import gpu
from app.config import ConfigError, TrainConfig, check_options, parse_config
from tests.extras import needs

REPO = Path(__file__).resolve().parents[1]


BAD_VALUES = [
    (["--epochs", "0"], "--epochs"),
    (["--batch-size", "-8"], "--batch-size"),
    (["--batch-size", "0"], "--batch-size"),
    (["--dataset", "cifar"], "--dataset"),
    (["--lr", "0"], "--lr"),
    (["--momentum", "1.5"], "--momentum"),
    (["--threads", "0"], "--threads"),
    (["--warmup-epochs", "-1"], "--warmup-epochs"),
    (["--resume"], "--checkpoint-dir"),
    (["--progress", "fancy"], "--progress"),
]


@pytest.mark.parametrize("argv, flag", BAD_VALUES)
def test_bad_values_are_refused_naming_the_flag(argv, flag):
    with pytest.raises(ConfigError, match=flag):
        parse_config(argv)


@pytest.mark.parametrize("argv, flag", BAD_VALUES)
def test_the_launchers_check_refuses_what_the_trainer_refuses(argv, flag):
    """check_options (the launcher's, before a job starts) keeps every rule parse_config has that needs no folder."""
    with pytest.raises(ConfigError, match=flag):
        check_options(argv)


def test_the_launchers_check_returns_what_the_trainer_has_no_option_for():
    assert check_options(["--gpu", "2", "--epochs", "3"]) == ["--gpu", "2"]
    assert check_options(["--epochs", "3", "--help"]) == []
    with pytest.raises(SystemExit):  # the trainer itself: argparse's usage line and exit status 2
        parse_config(["--gpu", "2"])


def test_unwritable_checkpoint_dir_is_refused(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match="--checkpoint-dir .* is not writable"):
        parse_config(["--checkpoint-dir", str(blocker / "ckpt")])


@pytest.mark.parametrize("flag", ["--run-dir", "--tensorboard-dir"])
def test_unwritable_run_and_tensorboard_dirs_are_refused(tmp_path, flag):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match=f"{flag} .* is not writable"):
        parse_config([flag, str(blocker / "run")])


@needs("tensorboard")  # --run-dir writes TensorBoard events
def test_run_dir_holds_every_output_unless_a_flag_says_otherwise(tmp_path):
    run = tmp_path / "runs" / "3f9a1c2e"
    config = parse_config(["--run-dir", str(run), "--summary-file", str(tmp_path / "elsewhere.json")])
    assert (config.metrics_file, config.summary_file, config.checkpoint_dir, config.tensorboard_dir) == (
        run / "metrics.jsonl",
        tmp_path / "elsewhere.json",
        run / "checkpoints",
        run / "tb",
    )
    assert config.curves_file == run / "curves.png"
    assert (run / "checkpoints").is_dir() and (run / "tb").is_dir()


def test_without_run_dir_only_what_is_asked_for_is_written(tmp_path):
    config = parse_config(["--metrics-file", str(tmp_path / "m" / "metrics.jsonl")])
    assert (config.checkpoint_dir, config.tensorboard_dir, config.summary_file) == (None, None, None)
    assert config.curves_file == tmp_path / "m" / "curves.png"
    assert parse_config([]).curves_file is None


def test_good_values_parse(tmp_path):
    config = parse_config(
        [
            "--dataset",
            "synthetic",
            "--epochs",
            "3",
            "--checkpoint-dir",
            str(tmp_path / "c"),
            "--resume",
            "--fp16-allreduce",
            "--use-adasum",
            "--lr",
            "0.05",
        ]
    )
    assert config == TrainConfig(
        dataset="synthetic",
        epochs=3,
        checkpoint_dir=tmp_path / "c",
        resume=True,
        fp16_allreduce=True,
        use_adasum=True,
        base_lr=0.05,
    )
    assert (tmp_path / "c").is_dir()


@needs("torch")  # the trainer runs only with a framework
def test_cli_prints_one_line_and_exits_nonzero_before_training():
    result = subprocess.run(
        [sys.executable, "-m", "app.train", "--epochs", "0"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: --epochs must be at least 1 (got 0)"]
    assert "epoch" not in result.stdout


@pytest.mark.parametrize(
    "environ, cuda, no_cuda, refused",
    [
        ({}, False, False, False),  # a CPU job
        ({"HOROVOD_STACK_GPUS": "1"}, True, False, False),
        ({"HOROVOD_STACK_GPUS": "1"}, False, True, False),  # --no-cuda: the user's choice
        ({"HOROVOD_STACK_GPUS": "1"}, False, False, True),
    ],
)
def test_ranks_given_gpus_refuse_to_train_on_the_cpu(environ, cuda, no_cuda, refused):
    problem = gpu.cuda_problem(environ, cuda, no_cuda)
    assert (problem is not None) == refused
    if problem is not None:
        assert "NVIDIA driver >= 580" in problem and "compute capability >= 7.5" in problem


@pytest.mark.parametrize(
    "value, asked",
    [("1", True), ("true", True), ("yes", True), ("0", False), ("", False), ("no", False), ("false", False)],
)
@pytest.mark.parametrize("build", [gpu.TORCH_BUILD, gpu.TENSORFLOW_BUILD])
@needs("numpy")
def test_both_trainers_read_the_gpu_request_by_one_rule(value, asked, build):
    """HOROVOD_STACK_GPUS says yes only as 1, true or yes, for PyTorch's trainer and Keras' alike (the Keras trainer
    once took any value, 0 too, as yes); the framework is asked whether CUDA works only when it says yes."""
    from app import train_loop

    questions = []

    def cuda_available() -> bool:
        questions.append(build)
        return False

    environ = {gpu.GPUS_ASKED: value}
    if asked:
        with pytest.raises(ConfigError, match=f"^GPUs were asked for .*{build.framework}"):
            train_loop.checked_config(["--epochs", "1"], build, cuda_available, environ)
    else:
        assert train_loop.checked_config(["--epochs", "1"], build, cuda_available, environ).epochs == 1
    assert questions == ([build] if asked else [])
    assert gpu.gpus_asked(environ) is asked


@pytest.mark.parametrize(
    "user_set, given",
    [
        ((), ("HOROVOD_STACK_GPUS=1", "TF_FORCE_GPU_ALLOW_GROWTH=true")),
        (("NCCL_DEBUG",), ("HOROVOD_STACK_GPUS=1", "TF_FORCE_GPU_ALLOW_GROWTH=true")),
        (("TF_FORCE_GPU_ALLOW_GROWTH",), ("HOROVOD_STACK_GPUS=1",)),  # the user's own value stays theirs
    ],
)
def test_every_rank_of_a_gpu_job_gets_tensorflows_memory_growth_unless_the_user_sets_it(user_set, given):
    """Memory growth is TensorFlow's (torch reads no TF_* variable), given on every image: not every launch method knows
    which framework the image holds. CUDA_VISIBLE_DEVICES is never given: Horovod's own pin line
    (`gpus[hvd.local_rank()]`) needs every GPU of the node listed."""
    assert gpu.gpu_rank_env(user_set) == given
    assert dict(gpu.TENSORFLOW_BUILD.rank_env) == {"TF_FORCE_GPU_ALLOW_GROWTH": "true"} and not gpu.TORCH_BUILD.rank_env


@needs("torch")
def test_a_rank_given_gpus_without_cuda_stops_in_one_line():
    """Here CUDA is never available, as on a host whose driver is older than torch's CUDA build needs."""
    result = subprocess.run(
        [sys.executable, "-m", "app.train", "--dataset", "synthetic", "--epochs", "1"],
        cwd=REPO,
        env={**os.environ, "HOROVOD_STACK_GPUS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {gpu.cuda_problem({'HOROVOD_STACK_GPUS': '1'}, False, False)}"
    ]
