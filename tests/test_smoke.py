"""The image's `smoke` role run for real, as a CI job runs it: docs/ci.md's line as typed, `docker run --rm -v
CHECKOUT:/workdir -w /workdir IMAGE smoke ...` (no --user, no --shm-size), over a copy of a user's code owned as a CI
runner's checkout is: GitHub's runner (uid 1001), GitLab's jobs (root), the image's own uid (1000), any other (4242).
The pure parts (lines, verdicts, JUnit XML, faulthandler's stacks, shared memory): tests/test_smoke_report.py.

Together about 1.5 minutes on 2 cores (see docs/testing.md); runs that mostly wait go side by side.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from app import rank_error
from app.frameworks import TENSORFLOW

pytestmark = pytest.mark.integration

IMAGE = os.environ.get("IMAGE", "horovod-stack:latest")
TESTS = Path(__file__).resolve().parent
BENCHMARK = TESTS / "user_script" / "synthetic_benchmark.py"
PROBE = TESTS / "user_script" / "smoke_probe.py"
STALL = TESTS / "user_script" / "stall.py"
LOADER = TESTS / "user_script" / "image_loader.py"
GITHUB_RUNNER = 1001
"""The uid of GitHub's hosted runner, who owns its checkout."""
IMAGE_USER = 1000
ANOTHER = 4242
"""A uid neither the image nor a runner has."""
BENCHMARK_ARGS = ["--no-cuda", "--model", "mobilenet_v3_small", "--batch-size", "4", "--num-warmup-batches", "1",
                  "--num-batches-per-iter", "1", "--num-iters", "2"]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def image() -> str:
    found = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, text=True)
    assert found.returncode == 0, f"{IMAGE} is not built here: scripts/build-images.sh"
    return IMAGE


def checkout(tmp_path: Path, owner: int, *files: Path) -> Path:
    """A CI runner's checkout holding `files`, owned by `owner` (mode 755 folders, 644 files, as git leaves them)."""
    folder = tmp_path / "checkout"
    folder.mkdir(parents=True)
    for file in files:
        shutil.copy(file, folder / file.name)
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, owner, owner)
        path.chmod(0o755 if path.is_dir() else 0o644)
    return folder


def smoke_argv(folder: Path, *args: str, user: str | None = None, docker: tuple[str, ...] = ()) -> list[str]:
    """The documented line: docker run --rm -v "$PWD:/workdir" -w /workdir IMAGE smoke ARGS (user, docker: options
    the line does not have)."""
    who = ["--user", user] if user is not None else []
    return ["docker", "run", "--rm", *who, *docker, "-v", f"{folder}:/workdir", "-w", "/workdir", IMAGE, "smoke", *args]


def smoke(folder: Path, *args: str, user: str | None = None, docker: tuple[str, ...] = (),
          timeout: float = 180) -> tuple[subprocess.CompletedProcess, float]:  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(smoke_argv(folder, *args, user=user, docker=docker), capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    seconds = time.monotonic() - started
    print(f"smoke {' '.join(args)}: exit {done.returncode} in {seconds:.1f} s\n{done.stdout}{done.stderr}")
    return done, seconds


def last_line(done: subprocess.CompletedProcess) -> str:
    return (done.stdout + done.stderr).strip().splitlines()[-1]


def together(**argv: list[str]) -> dict[str, tuple[int, str, float]]:
    """Several runs side by side: each one's (exit status, output, seconds from the start)."""
    started = time.monotonic()
    running = {name: subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for name, command in argv.items()}  # fmt: skip
    results = {}
    for name, process in running.items():
        output, _ = process.communicate(timeout=180)
        results[name] = (process.returncode, output, time.monotonic() - started)
        print(f"{name}: exit {process.returncode} in {results[name][2]:.1f} s\n{output}")
    return results


def first_line(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("smoke: "))


def owners(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path the run left in the checkout and its owner."""
    return {str(path.relative_to(folder)): (path.stat().st_uid, path.stat().st_gid) for path in folder.rglob("*")}


def junit(path: Path) -> dict[str, str | None]:
    """Each test case's name and its failure message (None: passed)."""
    root = ET.parse(path).getroot()
    return {case.get("name", ""): (failure.get("message") if (failure := case.find("failure")) is not None else None)
            for case in root.iter("testcase")}  # fmt: skip


def test_a_synthetic_benchmark_on_githubs_checkout(tmp_path):
    """A user's Horovod script (tests/user_script/synthetic_benchmark.py: a torchvision model, DistributedOptimizer,
    the broadcasts from rank 0), --no-cuda, 2 ranks, on GitHub's checkout (uid 1001), the line as typed (the container
    starts as root and becomes 1001), with no network at all (Gloo over loopback): every rank trains and reports."""
    folder = checkout(tmp_path, GITHUB_RUNNER, BENCHMARK)
    done, seconds = smoke(folder, "--np", "2", "--junit", "reports/smoke.xml", "--", "python", BENCHMARK.name,
                          *BENCHMARK_ARGS, docker=("--network", "none"))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert last_line(done).startswith("smoke: passed: 2 ranks over Gloo in ")
    assert ", shared memory /dev/shm 64 MB, uid 1001 in /workdir: " in first_line(done.stdout)
    for rank in (0, 1):
        assert f"[rank {rank}] rank {rank}: round 2 of 2: " in done.stdout
    assert "[rank 0] total: " in done.stdout and " img/sec on 2 CPU ranks" in done.stdout
    assert junit(folder / "reports" / "smoke.xml") == {"rank 0": None, "rank 1": None, "job: 2 ranks over Gloo": None}
    assert set(owners(folder).values()) == {(GITHUB_RUNNER, GITHUB_RUNNER)}, owners(folder)
    assert set(owners(folder)) == {BENCHMARK.name, "reports", "reports/smoke.xml"}  # no bytecode left behind


def test_a_failing_rank_and_a_hang(tmp_path):
    """Side by side, both the line as typed: (1) on a checkout of a uid the image does not know (4242): the ranks
    run as 4242 over Gloo without CUDA, and rank 1 raises: the run fails naming rank 1. (2) On the image user's
    checkout, a script whose rank 1 blocks while rank 0 waits in an allreduce, --timeout 20 (no extra capability, so
    py-spy may not trace and Python's faulthandler gives the stacks): it fails within 40 s naming where each rank
    was."""
    failing = checkout(tmp_path / "failing", ANOTHER, PROBE)
    hanging = checkout(tmp_path / "hanging", IMAGE_USER, STALL)
    results = together(
        failing=smoke_argv(failing, "--np", "2", "--junit", "smoke.xml", "--", "python", PROBE.name, "--fail-on-rank",
                           "1"),
        hanging=smoke_argv(hanging, "--np", "2", "--timeout", "20", "--", "python", STALL.name),
    )  # fmt: skip

    status, output, _ = results["failing"]
    assert status == 1, output
    # `rank 1 exited with status 1: ...`, or, where Horovod's shutdown made rank 0 exit first and horovodrun ended
    # rank 1 before it could, `rank 1 failed first: ...`
    last = output.strip().splitlines()[-1]
    assert last.startswith("smoke: failed: rank 1 "), last
    assert last.endswith(": RuntimeError: probe failed on purpose on rank 1"), last
    for rank in (0, 1):
        assert (f"[rank {rank}] probe rank {rank} of 2: gloo_enabled=True mpi_enabled=False cuda_available=False "
                f"uid={ANOTHER}") in output  # fmt: skip
    assert "[rank 1] Traceback (most recent call last):" in output
    assert rank_error.MARKER not in output  # rank 1's record is read, not shown
    cases = junit(failing / "smoke.xml")
    assert list(cases) == ["rank 0", "rank 1", "job: 2 ranks over Gloo"]
    assert (cases["rank 1"] or "").endswith("RuntimeError: probe failed on purpose on rank 1"), cases
    assert cases["job: 2 ranks over Gloo"] == last.removeprefix("smoke: failed: ")
    assert "after rank 1 failed" in (cases["rank 0"] or ""), cases  # it waited for rank 1 in an allreduce
    assert set(owners(failing)) == {PROBE.name, "smoke.xml", "probe-output", "probe-output/rank-0.txt",
                                    "probe-output/rank-1.txt"}  # fmt: skip
    assert set(owners(failing).values()) == {(ANOTHER, ANOTHER)}, owners(failing)

    status, output, seconds = results["hanging"]
    assert status == 124, output
    assert seconds < 40, seconds
    last = output.strip().splitlines()[-1]
    assert last.startswith("smoke: failed: timed out after 20 s: rank 1 (localhost pid "), last
    assert "in wait_for_data at stall.py:15 while rank 0 in " in last and "from main at stall.py:26" in last, last
    assert "smoke: every rank's Python stack (" in output
    assert "    wait_for_data (/workdir/stall.py:15)" in output


def test_a_dataloader_with_workers_in_dockers_64_mb_of_shared_memory(tmp_path):
    """A DataLoader with 2 workers over batches of 64 images of 224x224 (about 150 MB of shared memory a rank), side
    by side: the line as typed (Docker's 64 MB /dev/shm) fails in one line naming shared memory and --shm-size, torch's
    error after it; with --shm-size 1g, as that line says, it passes."""
    plain = checkout(tmp_path / "plain", IMAGE_USER, LOADER)
    roomy = checkout(tmp_path / "roomy", IMAGE_USER, LOADER)
    results = together(
        plain=smoke_argv(plain, "--", "python", LOADER.name),
        roomy=smoke_argv(roomy, "--", "python", LOADER.name, docker=("--shm-size", "1g")),
    )

    status, output, _ = results["plain"]
    assert status == 1, output
    assert ", shared memory /dev/shm 64 MB, uid 1000 in /workdir: " in first_line(output)
    last = output.strip().splitlines()[-1]
    assert last.startswith("smoke: failed: rank "), last
    assert ": out of shared memory (/dev/shm 64 MB, shared by the ranks and their DataLoader workers): give the " \
        "container more, docker run --shm-size 1g ... (" in last, last  # fmt: skip
    assert "shared memory" in last.split(" ... (", 1)[1], last  # torch's own line, after

    status, output, _ = results["roomy"]
    assert status == 0, output
    assert ", shared memory /dev/shm 1024 MB, uid 1000 in /workdir: " in first_line(output)
    for rank in (0, 1):
        assert f"[rank {rank}] loader rank {rank}: 384 images of (3, 224, 224) from 2 workers, 768 on all 2 ranks" \
            in output  # fmt: skip
    assert owners(plain) == owners(roomy) == {LOADER.name: (IMAGE_USER, IMAGE_USER)}


SHIPPED_HARNESS = """print("smoke: passed: 2 ranks over Gloo in 0.1 s (the checkout's own harness)")\n"""
SHIPPED_TRAINER = """print("validation accuracy 1.000 (the checkout's own trainer)")\n"""


def shipped_harness(folder: Path) -> None:
    """The code under test ships its own launcher/smoke/__main__.py and app/train.py: found first on the import path,
    they would judge themselves."""
    for relative, text in (("launcher/smoke/__main__.py", SHIPPED_HARNESS), ("app/train.py", SHIPPED_TRAINER)):
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        for package in (path.parent, path.parent.parent):
            if package != folder:
                (package / "__init__.py").write_text("")
        path.write_text(text)
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, 0, 0)


def test_the_bundled_trainer_on_roots_checkout(tmp_path):
    """No command: the bundled trainer, briefly, on the digits set; it learned and the ranks agree; the JUnit report
    parses. On a root-owned folder (a GitLab job's own checkout), the line as typed: root's, and stays root's. That
    checkout ships a launcher/smoke/__main__.py and an app/train.py of its own, which change nothing: the image's
    harness and trainer judge it."""
    folder = checkout(tmp_path, 0)
    shipped_harness(folder)
    shipped = set(owners(folder))
    done, seconds = smoke(folder, "--junit", "smoke.xml")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-1].startswith("smoke: passed: 2 ranks over Gloo in ")
    assert lines[-3].startswith("smoke: the bundled trainer: validation accuracy 0.")
    assert lines[-3].endswith("after 3 epochs (chance 0.100), parameters identical on all 2 ranks")
    assert float(lines[-3].split()[6]) >= 0.8
    assert junit(folder / "smoke.xml") == {"rank 0": None, "rank 1": None, "job: 2 ranks over Gloo": None}
    assert "the checkout's own" not in done.stdout + done.stderr
    assert {path: owner for path, owner in owners(folder).items() if path not in shipped} == {"smoke.xml": (0, 0)}


@pytest.mark.parametrize("user", [None, "0"], ids=["line as typed", "--user 0"])
def test_ranks_on_roots_checkout_have_no_capabilities(tmp_path, user):
    """On a root-owned checkout the ranks run as root, with no capability and no_new_privs (Docker's default set
    would let code under test plant setuid binaries or device nodes in the host's checkout), whether the container
    starts as the image's default or with --user 0; what they leave stays root's."""
    folder = checkout(tmp_path, 0, PROBE)
    done, _ = smoke(folder, "--np", "2", "--", "python", PROBE.name, user=user)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        assert f"[rank {rank}] probe rank {rank} of 2: " in done.stdout
        assert "uid=0 CapEff=0000000000000000 NoNewPrivs=1" in done.stdout.split(f"[rank {rank}] probe rank")[1]
    assert set(owners(folder).values()) == {(0, 0)}, owners(folder)


def test_a_user_who_is_not_the_owner_reads_and_is_told_the_fix_only_to_write(tmp_path):
    """Started as the image's user (--user 1000, as a platform may start it) on GitHub's checkout (uid 1001, mode
    755): it runs what only reads the checkout; asked for a JUnit report there, it says in one line what to do
    instead, before any rank starts."""
    folder = checkout(tmp_path, GITHUB_RUNNER, PROBE)
    done, _ = smoke(folder, "--np", "1", "--", "head", "-n", "1", PROBE.name, user=str(IMAGE_USER))
    assert done.returncode == 0, done.stdout + done.stderr
    assert '[rank 0] """A user\'s script for the smoke role\'s tests' in done.stdout
    done, seconds = smoke(folder, "--junit", "reports/smoke.xml", "--", "python", PROBE.name, user=str(IMAGE_USER))
    assert done.returncode == 2
    assert (done.stdout + done.stderr).strip().splitlines() == [
        "smoke: failed: uid 1000 cannot write the JUnit report reports/smoke.xml (/workdir is owned by 1001:1001): run "
        "the container as root, the image's default (no --user), or as the folder's owner, "
        'docker run --user "$(id -u):$(id -g)" ...'
    ]
    assert seconds < 10
    assert set(owners(folder)) == {PROBE.name}


TF_IMAGE = os.environ.get("TENSORFLOW_IMAGE", TENSORFLOW.image)
PLANT = """cp /usr/bin/id s; chmod 6755 s; chmod g+s .
setsid sh -c 'sleep 4; chmod 6755 s; echo tampered > smoke.xml' > /dev/null 2>&1 &
"""
"""What a rank on a root-owned checkout could leave: a setuid-root copy of a program, a setgid folder, and a detached
process that sets the bit again and rewrites the report once the harness is done."""


def test_a_rank_on_roots_checkout_leaves_no_setuid_file_and_no_process_behind(tmp_path):
    """On a root-owned checkout, in each image, the GitLab template's way (a shell runs the entrypoint's `smoke`, so
    the harness is not PID 1, and the container lives on after it): the harness kills what the rank left, clears
    the bits it set (`find -perm /6000` finds nothing), and the report stays its own."""
    folders = {image: checkout(tmp_path / image.replace(":", "-"), 0) for image in (IMAGE, TF_IMAGE)}
    for folder in folders.values():
        (folder / "plant.sh").write_text(PLANT)
    results = together(**{
        image: ["docker", "run", "--rm", "-v", f"{folder}:/workdir", "-w", "/workdir", "--entrypoint", "", image,
                "sh", "-c", "/opt/horovod-stack/docker/entrypoint.sh smoke --np 1 --junit smoke.xml -- sh plant.sh; "
                "status=$?; sleep 6; exit $status"]
        for image, folder in folders.items()
    })  # fmt: skip
    for image, folder in folders.items():
        status, output, _ = results[image]
        assert status == 0, output
        assert "smoke: cleared the setuid/setgid bits the ranks set on 2 path(s) in /workdir: ., s (" in output, output
        found = subprocess.run(["find", str(folder), "-perm", "/6000"], capture_output=True, text=True, check=True)
        assert found.stdout == "", (image, found.stdout)
        assert junit(folder / "smoke.xml") == {"rank 0": None, "job: 1 rank over Gloo": None}, image
