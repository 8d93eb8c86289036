"""Which framework a process runs on, and the one line for a script run on the other framework's image."""

import subprocess
import sys

import pytest

from app import frameworks
from app.frameworks import PYTORCH, TENSORFLOW
from tests.extras import needs


@pytest.mark.parametrize(
    ("missing", "current", "wanted"),
    [
        ("torch", TENSORFLOW, PYTORCH),
        ("torchvision.transforms", TENSORFLOW, PYTORCH),
        ("tensorflow", PYTORCH, TENSORFLOW),
        ("keras", PYTORCH, TENSORFLOW),
        ("tf_keras", PYTORCH, TENSORFLOW),
        ("pandas", PYTORCH, None),
        ("torch", PYTORCH, None),
    ],
)
def test_a_missing_framework_names_the_image_that_holds_it(missing, current, wanted):
    message = frameworks.wrong_image_message(missing, current)
    if wanted is None:
        assert message is None
    else:
        assert message is not None and message.startswith("error: ") and "\n" not in message
        assert f"run it on {wanted.image}" in message and f"--image {wanted.image}" in message
        assert current.image in message


@needs("torch")
def test_this_environment_holds_pytorch():
    assert frameworks.installed() is PYTORCH


def test_the_images_hook_ends_a_wrong_image_script_with_its_line_and_leaves_other_errors_alone(tmp_path):
    """As the image's .pth runs it, in a child where torch cannot be found (as on the TensorFlow image) but
    tensorflow can (a stand-in package)."""
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text("")
    hook = "import sys; sys.modules['torch'] = None; import app.frameworks as f; f.install()\n"
    for script, expected in (("import torch\n", TENSORFLOW), ("import not_a_package_anywhere\n", None)):
        result = subprocess.run(
            [sys.executable, "-c", hook + script], capture_output=True, text=True, env={"PYTHONPATH": f"{tmp_path}:."}
        )
        assert result.returncode == 1
        lines = result.stderr.strip().splitlines()
        if expected is None:
            assert lines[-1] == "ModuleNotFoundError: No module named 'not_a_package_anywhere'"
        else:
            assert lines == [frameworks.wrong_image_message("torch", expected)]
