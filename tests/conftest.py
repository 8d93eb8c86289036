"""What every test shares: builders of settings, plans and job specs from flat keyword arguments, the two groups
the suite runs in under pytest-xdist, the test hosts (tests/multihost.py) and the figures the tests measured. The
stand-ins of the unit tests are tests/standins.py's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from launcher.core.jobspec import JobSpec
from launcher.core.options import JobOptions
from launcher.host.planning.plan import ClusterPlan, Found
from launcher.host.planning.settings import LaunchSettings

JOB_OPTIONS = {field.name for field in dataclasses.fields(JobOptions)}


# --- builders -------------------------------------------------------------------------------------------------
def job_options_of(fields: dict) -> JobOptions:
    """The JobOptions among flat keywords, taken out of `fields`; an elastic minimum makes the job elastic."""
    job = {key: fields.pop(key) for key in list(fields) if key in JOB_OPTIONS}
    if job.get("elastic_min_workers") is not None:
        job.setdefault("elastic", True)
    if job.get("workdir") is not None:
        job["workdir"] = str(job["workdir"])
    return JobOptions(**job)


def launch_settings(**fields) -> LaunchSettings:
    """LaunchSettings from flat keywords: JobOptions' fields go to its job, the rest to the settings."""
    job = job_options_of(fields)
    return LaunchSettings(**{"nodes": ("gpu-a", "gpu-b"), **fields, "job": job})


def plan_of(cluster_id: str = "c0ffee00", found: Found | None = None, **fields) -> ClusterPlan:
    return ClusterPlan.of(launch_settings(**fields), cluster_id=cluster_id, found=found)


def job_spec(**fields) -> JobSpec:
    """A JobSpec from flat keywords, JobOptions' fields to its options."""
    options = job_options_of(fields)
    return JobSpec(**{"job_id": "j1", "expected_workers": 2, **fields, "options": options})


# --- the test hosts, and the two groups under pytest-xdist (scripts/test.sh runs `pytest -n 2`) ----------------
TEST_HOST_MODULES = frozenset(
    {
        "test_launcher_multihost.py",
        "test_mpijob_conformance.py",
        "test_mpiports_on_test_hosts.py",
        "test_rendezvous_on_test_hosts.py",
        "test_tensorflow_multihost.py",
    }
)
"""The modules whose tests run on the test hosts (the `test_hosts` fixture): one worker runs all of them, in file
order, since the harness is one per machine and a module's tests build on each other; the other worker runs
everything else. The test hosts' tests mostly wait on containers, timeouts and the network, so the two groups overlap
well on two cores."""


RUN_LAST = ("test_image_delivery.py", "test_slurm_cluster.py")
"""Modules run after the rest of their group, in this order: a 6.7 GB push to a registry, a pull onto a test host of
the module's own and a push to its spare are heavy on the disk, so they come late, while the test hosts' group mostly
waits on jobs, and not at the start, while it copies the image to its own nodes; the Slurm cluster's SIF builds
(about 9 GB at their peak, 8 GB kept) come after those, not beside them."""


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]


def room_of(nodeid: str) -> str:
    return "test-hosts" if module_of(nodeid) in TEST_HOST_MODULES else "this-host"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """RUN_LAST's modules go last. A test that uses the test hosts outside TEST_HOST_MODULES would share them with
    another worker: refused."""
    last = {module: place for place, module in enumerate(RUN_LAST, start=1)}
    items.sort(key=lambda item: last.get(module_of(item.nodeid), 0))
    for item in items:
        if "test_hosts" in getattr(item, "fixturenames", ()) and room_of(item.nodeid) != "test-hosts":
            raise pytest.UsageError(
                f"{item.nodeid} uses the test hosts: add its module to TEST_HOST_MODULES (tests/conftest.py)"
            )


@pytest.hookimpl(optionalhook=True)  # pytest without xdist (the launcher installed alone) has no such hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's own grouping (--dist loadgroup) renames node ids, which pytest 9.2 no longer allows; this scheduler
    groups the tests itself instead: one work unit per group, so each of the two workers takes one."""
    from xdist.scheduler import LoadScopeScheduling

    class TwoRooms(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return room_of(nodeid)

    return TwoRooms(config, log)


# --- figures the tests measure -------------------------------------------------------------------------------------
@pytest.fixture
def measured(record_property: Callable[[str, object], None]) -> Callable[[str], None]:
    """Records one figure the test measured (how long a push, a restart or a stop took) for the run's summary: under
    pytest-xdist a passed test's prints are not shown, and these figures belong in every run's log, CI's too."""

    def record(line: str) -> None:
        print(f"\n{line}")
        record_property("measured", line)

    return record


def pytest_terminal_summary(terminalreporter) -> None:
    """The figures the tests measured (`measured`), one line each with the test that measured it."""
    figures = {
        (report.nodeid, value)
        for outcome in ("passed", "failed")
        for report in terminalreporter.stats.get(outcome, [])
        for name, value in report.user_properties
        if name == "measured"
    }
    if figures:
        terminalreporter.section("figures the tests measured")
        for nodeid, value in sorted(figures):
            terminalreporter.line(f"{value}  [{nodeid.rsplit('/', 1)[-1]}]")


@pytest.fixture(scope="session")
def test_hosts():
    """The two test hosts of tests/multihost.py and one spare host (node_3, for `--spares`), shared by every
    multi-host module: started once, on first use (a run of the unit tests alone starts none), removed when the run
    ends. Each module's own fixture puts the images it needs on them and leaves no container behind."""
    from tests.multihost import started_cluster  # the harness needs root and a Docker engine: only when asked

    with started_cluster(2, spares=1) as harness:
        yield harness
