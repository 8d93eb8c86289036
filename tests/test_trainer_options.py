"""Every launcher option is checked before anything starts: a word `launcher start` or `launcher export mpijob` does
not know goes to the bundled trainer, whose own parser checks it on this machine (no torch needed), so a mistyped
launcher option or a malformed trainer value is one line naming it and the fix, exit 2, no node contacted and no
document written. A command of the user's own is theirs, left as it is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from app.entrypoint import TRAINER
from launcher import cli
from launcher.cli import app
from launcher.host.planning.trainer import trainer_problem

REPO = Path(__file__).resolve().parents[1]
START_OPTIONS = ["--nodes", "--gpus", "--gpus-per-node", "--slots", "--push-image", "--no-push-image", "--env"]
EXPORT_OPTIONS = ["--name", "--workers", "--gpus-per-node", "--slots", "--env", "--output", "-o"]


@pytest.mark.parametrize(
    "words, options, expected",
    [
        (
            ["--gpu", "2"],
            START_OPTIONS,
            "--gpu is neither a launcher option nor one of the bundled trainer's; did you mean the launcher's --gpus "
            "(before any `--`)?",
        ),
        (["--gpu=2"], START_OPTIONS, "did you mean the launcher's --gpus (before any `--`)?"),
        (["--gpu", "2"], EXPORT_OPTIONS, "did you mean the launcher's --gpus-per-node (before any `--`)?"),
        (["--push", "--epochs", "2"], START_OPTIONS, "did you mean the launcher's --push-image (before any `--`)?"),
        (
            ["--batchsize", "64"],
            START_OPTIONS,
            "--batchsize is neither a launcher option nor one of the bundled "
            "trainer's; did you mean the trainer's --batch-size?",
        ),
        (
            ["--batchsize", "64"],
            [],
            "the bundled trainer has no option --batchsize; did you mean the trainer's --batch-size?",
        ),
        (
            ["--frobnicate"],
            START_OPTIONS,
            "--frobnicate is neither a launcher option nor one of the bundled trainer's: "
            "check its spelling, or drop it",
        ),
        (
            ["--nodes", "c"],
            START_OPTIONS,
            "--nodes is an option of the launcher, not of the bundled trainer: put it before the `--`",
        ),
        (["--epochs", "x"], START_OPTIONS, "the bundled trainer's options: argument --epochs: invalid int value: 'x'"),
        (["--epochs"], START_OPTIONS, "the bundled trainer's options: argument --epochs: expected one argument"),
        (
            ["--e", "3"],
            START_OPTIONS,
            "the bundled trainer's options: ambiguous option: --e could match --epochs, --elastic",
        ),
        (["--epochs", "0"], START_OPTIONS, "the bundled trainer's options: --epochs must be at least 1 (got 0)"),
        (["--dataset", "cifar"], START_OPTIONS, "the bundled trainer's options: unknown dataset 'cifar'"),
        (["--resume"], START_OPTIONS, "the bundled trainer's options: --resume needs --checkpoint-dir"),
        (
            ["--epochs", "2", "train.py"],
            START_OPTIONS,
            "the bundled trainer takes options only, not 'train.py': a command of your own comes first after `--`",
        ),
    ],
)
def test_options_the_trainer_would_refuse_are_one_line_naming_the_option_and_the_fix(words, options, expected):
    problem = trainer_problem((*TRAINER, *words), options)
    assert problem is not None and expected in problem
    assert "\n" not in problem


@pytest.mark.parametrize(
    "words",
    [
        [],
        ["--dataset", "digits", "--epochs", "5", "--lr", "0.05", "--fp16-allreduce"],
        ["--epoch", "3"],  # an abbreviation the trainer's argparse takes
        ["--run-dir", "/shared/runs/r1", "--resume"],  # --run-dir gives --resume its checkpoints
        ["--help"],
    ],
)
def test_options_the_trainer_takes_pass(words):
    assert trainer_problem((*TRAINER, *words), START_OPTIONS) is None


def test_folders_are_the_nodes_not_this_machines(tmp_path):
    """The trainer's folders are in the workers: they need not exist here, and nothing is made here."""
    run, tensorboard = tmp_path / "no" / "run", tmp_path / "no" / "tb"
    words = ["--run-dir", str(run), "--tensorboard-dir", str(tensorboard), "--checkpoint-dir", "/root/ckpt"]
    assert trainer_problem((*TRAINER, *words)) is None
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize(
    "command",
    [
        ("python", "train.py", "--gpu", "2", "--epochs", "x"),
        ("torchrun", "--nproc-per-node", "2", "train.py"),
        ("bash", "-c", "python -m app.train --gpu 2"),
    ],
)
def test_a_command_of_the_users_own_is_left_as_it_is(command):
    assert trainer_problem(command, START_OPTIONS) is None


def test_the_check_imports_neither_torch_nor_horovod():
    """The launcher installs without them (`pip install .`): they are blocked, and the check still answers."""
    code = (
        "import sys\n"
        "for name in ('torch', 'torchvision', 'horovod', 'horovod.torch', 'sklearn', 'tensorboard'):\n"
        "    sys.modules[name] = None\n"
        "import launcher.cli\n"
        "from launcher.host.planning.trainer import trainer_problem\n"
        "print(trainer_problem(('python', '-m', 'app.train', '--epochs', 'x')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "the bundled trainer's options: argument --epochs: invalid int value: 'x'"


# --- the launcher's commands ----------------------------------------------------------------------------------------
@pytest.fixture
def reached(monkeypatch, tmp_path) -> list:
    """What reached the nodes' side of `launcher start` (launch.launch, launch.dry_run): their settings."""
    monkeypatch.chdir(tmp_path)  # no .env of the checkout's
    calls: list = []

    def launched(settings, **_) -> int:
        calls.append(settings)
        return 0

    monkeypatch.setattr(cli.launch, "launch", launched)
    monkeypatch.setattr(cli.launch, "dry_run", lambda settings, **_: calls.append(settings))
    monkeypatch.setattr(cli, "stop_on_signals", lambda: None)
    return calls


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    return lines[0]


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--gpu", "2"],
            "error: --gpu is neither a launcher option nor one of the bundled trainer's; did you mean the "
            "launcher's --gpus (before any `--`)?",
        ),
        (["--", "--epochs", "x"], "error: the bundled trainer's options: argument --epochs: invalid int value: 'x'"),
        (["--dry-run", "--", "--epochs", "-1"], "error: the bundled trainer's options: --epochs must be at least 1"),
    ],
)
def test_start_refuses_before_any_node_is_contacted(reached, args, expected):
    result = CliRunner().invoke(app, ["start", "--nodes", "a,b", *args])
    assert result.exit_code == 2
    assert one_error_line(result.output).startswith(expected)
    assert reached == []


@pytest.mark.parametrize(
    "args, command",
    [
        (["--", "python", "train.py", "--gpu", "2"], ("python", "train.py", "--gpu", "2")),
        (["--", "--dataset", "digits", "--epochs", "5"], (*TRAINER, "--dataset", "digits", "--epochs", "5")),
        (["--epochs", "5"], (*TRAINER, "--epochs", "5")),  # trainer options alone, no `--`, as before
    ],
)
def test_start_passes_the_users_command_and_good_trainer_options_on(reached, args, command):
    for extra in ([], ["--dry-run"]):
        result = CliRunner().invoke(app, ["start", "--nodes", "a,b", *extra, *args])
        assert result.exit_code == 0, result.output
    assert [settings.job.command for settings in reached] == [command, command]


def test_start_help_still_answers():
    result = CliRunner().invoke(app, ["start", "--help"])
    assert result.exit_code == 0 and "--nodes" in result.output


EXPORT = ["export", "mpijob", "--name", "digits", "--workers", "2", "--image", "registry.example.com/horovod-stack:1"]


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--gpu", "2"],
            "error: --gpu is neither a launcher option nor one of the bundled trainer's; did you mean the "
            "launcher's --gpus-per-node (before any `--`)?",
        ),
        (["--", "--epochs", "x"], "error: the bundled trainer's options: argument --epochs: invalid int value: 'x'"),
    ],
)
def test_export_mpijob_refuses_without_writing_a_document(tmp_path, args, expected):
    out = tmp_path / "job.yaml"
    result = CliRunner().invoke(app, [*EXPORT, "-o", str(out), *args])
    assert result.exit_code == 2
    assert one_error_line(result.output) == expected
    assert not out.exists()
    printed = CliRunner().invoke(app, [*EXPORT, *args])
    assert printed.exit_code == 2 and printed.stdout == ""


@pytest.mark.parametrize(
    "words, command",
    [
        (["--dataset", "digits", "--epochs", "5"], (*TRAINER, "--dataset", "digits", "--epochs", "5")),
        (["python", "train.py", "--gpu", "2"], ("python", "train.py", "--gpu", "2")),
    ],
)
def test_export_mpijob_writes_good_trainer_options_and_a_users_command_as_given(words, command):
    result = CliRunner().invoke(app, [*EXPORT, "--", *words])
    assert result.exit_code == 0, result.output
    launcher = yaml.safe_load(result.stdout)["spec"]["mpiReplicaSpecs"]["Launcher"]
    assert launcher["template"]["spec"]["containers"][0]["args"][-len(command) :] == list(command)
