"""examples/: two whole Horovod scripts (PyTorch, Keras 3) that users copy, and the README's snippets of them.

Unit tests: each snippet in README.md's "Your own script" is an excerpt of the file it names (each code line, comments
and whitespace aside, in the file in the same order; `...` stands for what is left out), the section shows one command
per example for compose, `launcher start --workdir` and the smoke role, and the examples import nothing of this
repository. Integration tests (the images): each example runs through compose and the smoke role by the README's own
command line, learns the digits and ends with the same parameters on every rank. The launcher's runs are on the test
hosts: tests/test_launcher_multihost.py (PyTorch) and tests/test_tensorflow_multihost.py (Keras).
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from app.frameworks import TENSORFLOW

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
README = REPO / "README.md"
SCRIPTS = ("pytorch_digits.py", "keras_digits.py")
IMAGE = os.environ.get("IMAGE", "horovod-stack:latest")
TF_IMAGE = os.environ.get("TENSORFLOW_IMAGE", TENSORFLOW.image)
"""The images the README's lines name, as this run's tests name them (the same unless IMAGE or TENSORFLOW_IMAGE)."""
LEARNED = 0.85
"""Validation accuracy the examples must reach in their default 5 epochs on 2 ranks (chance: 0.1; they reach 0.93 to
0.96 here)."""


def own_script_section() -> str:
    text = README.read_text()
    start = text.index("\n## Your own script\n")
    return text[start : text.index("\n## ", start + 1)]


def snippets(section: str) -> dict[str, str]:
    """Each ```python block of the section, by the examples/ file the prose before it names last."""
    found = {}
    for match in re.finditer(r"```python\n(.*?)```", section, re.S):
        named = re.findall(r"examples/(\w+\.py)", section[: match.start()])
        assert named, f"no examples/ file named before the snippet:\n{match[1]}"
        found[named[-1]] = match[1]
    return found


def code(line: str) -> str:
    """A line's code, comments and whitespace aside, a trailing comma before a closing bracket too (a call written
    on one line in the README may be one argument per line in the file)."""
    return re.sub(r",([)\]])", r"\1", re.sub(r"\s+", "", re.sub(r"(^|\s)#.*$", "", line)))


def drift(snippet: str, source: str) -> list[str]:
    """The snippet's lines that are not in the file in the snippet's order (none: it is an excerpt)."""
    text = code("".join(code(line) for line in source.splitlines()))
    position, problems = 0, []
    for line in snippet.splitlines():
        for piece in filter(None, code(line).split("...")):
            found = text.find(piece, position)
            if found == -1:
                problems.append(line)
                break
            position = found + len(piece)
    return problems


def readme_commands() -> dict[tuple[str, str], str]:
    """The section's command lines, by (entry point, example): compose, launcher, smoke."""
    block = re.search(r"```sh\n(.*?)```", own_script_section(), re.S)
    assert block, "no sh block in README.md's Your own script"
    commands = {}
    for line in block[1].splitlines():
        script = next(name for name in SCRIPTS if f"python {name}" in line)
        entry = "compose" if "docker compose up" in line else "launcher" if line.startswith("launcher ") else "smoke"
        assert (entry, script) not in commands, f"two {entry} lines for {script}"
        commands[entry, script] = line
    return commands


def with_test_images(line: str) -> str:
    return line.replace("horovod-stack:tensorflow", TF_IMAGE).replace("horovod-stack:latest", IMAGE)


RANK_LINE = re.compile(r"rank (\d+) of (\d+) on (\S+): parameters sha256 ([0-9a-f]{16})$", re.M)
ACCURACY = re.compile(r"val accuracy (\d\.\d+)$", re.M)


def learned_on_identical_ranks(output: str, ranks: int = 2) -> tuple[float, set[str]]:
    """The example's own lines: every rank's parameter digest (the same on all) and rank 0's last validation
    accuracy (above LEARNED). Returns that accuracy and the ranks' hosts."""
    lines = {int(rank): (host, digest) for rank, size, host, digest in RANK_LINE.findall(output) if int(size) == ranks}
    assert sorted(lines) == list(range(ranks)), output[-4000:]
    assert len({digest for _, digest in lines.values()}) == 1, f"ranks ended with different parameters: {lines}"
    accuracies = [float(value) for value in ACCURACY.findall(output)]
    assert accuracies and accuracies[-1] >= LEARNED, (accuracies, output[-4000:])
    return accuracies[-1], {host for host, _ in lines.values()}


def launch_example_as_typed(script: str, launch, measured) -> None:
    """The README's `launcher start ... --workdir ./examples -- python SCRIPT` line run through `launch` (the test
    cluster's launcher, given the words after `launcher`, the test images named): the example learns the digits on
    both nodes and its ranks end with the same parameters; nothing is left running."""
    words = shlex.split(with_test_images(readme_commands()["launcher", script]))
    assert words[:2] == ["launcher", "start"]
    started = time.monotonic()
    result = launch([str(EXAMPLES) if word == "./examples" else word for word in words[1:]])
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    assert "copied to /workdir on 2 node(s)" in result.stderr
    accuracy, hosts = learned_on_identical_ranks(result.stdout)
    measured(f"{script} through launcher start --workdir, 2 nodes: {seconds:.0f} s, val accuracy {accuracy}")
    assert hosts == {"node-1", "node-2"}, hosts


# --- unit tests ------------------------------------------------------------------------------------------------------
def test_each_readme_snippet_is_an_excerpt_of_its_example():
    found = snippets(own_script_section())
    assert sorted(found) == sorted(SCRIPTS)
    for name, snippet in found.items():
        assert len(snippet.splitlines()) >= 8, snippet  # the snippet was read whole
        assert drift(snippet, (EXAMPLES / name).read_text()) == [], f"README.md's snippet of examples/{name}"


@pytest.mark.parametrize(
    "changed, into",
    [
        ("lr=args.lr * hvd.size()", "lr=args.lr"),  # a value changed
        ("hvd.broadcast_parameters", "hvd.broadcast_params"),  # a name changed
        ("    torch.cuda.set_device(hvd.local_rank())", "torch.cuda.set_device(0)"),  # a line changed
    ],
)
def test_a_snippet_that_drifted_from_its_example_is_named(changed, into):
    snippet = snippets(own_script_section())["pytorch_digits.py"]
    source = (EXAMPLES / "pytorch_digits.py").read_text()
    assert changed in snippet
    drifted = snippet.replace(changed, into)
    assert drift(drifted, source) == [line for line in drifted.splitlines() if into in line]


def test_a_snippet_out_of_the_files_order_is_named():
    source = "import horovod.torch as hvd\nhvd.init()\nmodel = make()\n"
    assert drift("hvd.init()\nimport horovod.torch as hvd\n", source) == ["import horovod.torch as hvd"]
    assert drift("import horovod.torch as hvd  # the library\nhvd.init()\n...\n", source) == []


def test_the_readme_shows_one_command_per_example_and_entry_point():
    commands = readme_commands()
    assert sorted(commands) == sorted(
        (entry, script) for entry in ("compose", "launcher", "smoke") for script in SCRIPTS
    )
    for entry in ("compose", "launcher", "smoke"):  # the Keras lines name the TensorFlow image, the PyTorch ones not
        assert "horovod-stack:tensorflow" in commands[entry, "keras_digits.py"]
        assert "horovod-stack:tensorflow" not in commands[entry, "pytorch_digits.py"]
    for script in SCRIPTS:
        assert "WORKDIR=./examples " in commands["compose", script]
        assert "--workdir ./examples -- " in commands["launcher", script]
        assert '-v "$PWD/examples:/workdir" -w /workdir ' in commands["smoke", script]


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_examples_need_nothing_of_this_repository(script):
    """Users copy them: they import Horovod, their framework, NumPy and scikit-learn, nothing of app/ or launcher/."""
    imported: set[str] = set()
    for node in ast.walk(ast.parse((EXAMPLES / script).read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported - {"argparse", "hashlib", "os", "socket", "tempfile"} <= {
        "horovod",
        "torch",
        "keras",
        "tensorflow",
        "numpy",
        "sklearn",
    }


def test_the_rank_lines_are_read_and_a_difference_is_caught():
    """The integration tests' reader: two ranks' lines with the same digest pass; a differing digest, a missing rank
    or an accuracy at chance fail."""
    good = "epoch 5/5: val accuracy 0.9500\nrank 0 of 2 on a: parameters sha256 00112233aabbccdd\n"
    good += "rank 1 of 2 on b: parameters sha256 00112233aabbccdd\n"
    assert learned_on_identical_ranks(good) == (0.95, {"a", "b"})
    for bad in (
        good.replace("on b: parameters sha256 0011", "on b: parameters sha256 9911"),
        good.replace("rank 1 of 2", "rank 0 of 2"),
        good.replace("0.9500", "0.1100"),
    ):
        with pytest.raises(AssertionError):
            learned_on_identical_ranks(bad)


# --- the examples run for real: compose and the smoke role -----------------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("script", SCRIPTS)
def test_the_example_runs_through_compose_as_the_readme_types_it(script, tmp_path, measured):
    """`TRAIN_COMMAND=... WORKDIR=./examples docker compose up` in a copy of the checkout: both workers train, rank 0
    saves its checkpoint on the shared volume, and `up` ends by itself."""
    from tests.test_compose import ComposeRun

    words = shlex.split(with_test_images(readme_commands()["compose", script]))
    settings = dict(word.split("=", 1) for word in words[: words.index("docker")])
    assert words[words.index("docker") :] == ["docker", "compose", "up"]
    run = ComposeRun(tmp_path, **settings)
    try:
        started = time.monotonic()
        result = run.compose("up")
        seconds = time.monotonic() - started
        output = result.stdout + result.stderr
        assert result.returncode == 0 and "job succeeded (exit status 0)" in output, output[-5000:]
        accuracy, hosts = learned_on_identical_ranks(output)
        measured(f"{script} through compose, 2 workers, 5 epochs: {seconds:.0f} s, val accuracy {accuracy}")
        assert len(hosts) == 2, f"both ranks ran in one container: {hosts}"
        name = {"pytorch_digits.py": "pytorch_digits.pt", "keras_digits.py": "keras_digits.weights.h5"}[script]
        assert len(run.read_shared(f"checkpoints/{name}", binary=True)) > 10_000
    finally:
        run.down()


@pytest.mark.integration
@pytest.mark.parametrize("script", SCRIPTS)
def test_the_example_runs_through_the_smoke_role_as_the_readme_types_it(script, measured):
    """`docker run --rm -v "$PWD/examples:/workdir" -w /workdir IMAGE smoke --np 2 -- python SCRIPT` from the
    checkout, as typed: CUDA hidden, the checkout's owner's uid, no /shared to write (the checkpoint goes to /tmp)."""
    line = with_test_images(readme_commands()["smoke", script])
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", line], cwd=REPO, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    assert output.strip().splitlines()[-1].startswith("smoke: passed: 2 ranks over Gloo in "), output[-3000:]
    accuracy, _ = learned_on_identical_ranks(output)
    measured(f"{script} through the smoke role, 2 ranks, 5 epochs: {seconds:.0f} s, val accuracy {accuracy}")
