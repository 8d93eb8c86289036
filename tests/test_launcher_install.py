"""The launcher installs alone on the machine that starts jobs: `pip install .` brings no torch and no Horovod."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]


def test_pip_install_of_the_checkout_is_the_launcher_alone(tmp_path):
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", str(REPO)], check=True, timeout=600,
                   capture_output=True)
    freeze = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True,
                            check=True).stdout
    installed = {line.split("==")[0].lower() for line in freeze.split()}
    assert {"docker", "typer", "python-dotenv", "horovod-stack"} <= installed
    assert not {"torch", "torchvision", "horovod", "tensorboard", "matplotlib"} & installed, sorted(installed)
    help_text = subprocess.run([tmp_path / "venv" / "bin" / "launcher", "start", "--help"], capture_output=True,
                               text=True, timeout=60)
    assert help_text.returncode == 0 and "--nodes" in help_text.stdout, help_text.stderr
    assert sys.version_info[:2] == (3, 11)  # the project's Python (pyproject requires-python)
