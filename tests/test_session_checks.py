"""The launch's checks before any worker starts, against the stand-in engine (no Docker): the same findings refuse
a start and fill doctor's report (launcher/host/planning/preflight.py)."""

import io
import re

import pytest
import typer
from typer._click.exceptions import UsageError  # typer 0.29 carries its own click

from app import gpu
from app.gpu import FRAMEWORK_LABEL
from launcher.cli import app
from launcher.core import nics
from launcher.host.doctor import checkup
from launcher.host.engines.node_engine import NodeEngine, pull_failure
from launcher.host.planning import preflight
from launcher.host.planning.plan import ClusterPlan
from launcher.host.planning.preflight import NodeFacts, Severity
from launcher.host.running import launch, nodechecks
from launcher.host.running.rootcause import LaunchError
from tests.conftest import launch_settings
from tests.standins import IMAGE_ID, StandInEngine, connect_to, container

HOSTS = {"node_1": "10.0.0.1", "node_2": "10.0.0.2"}


def node_engine(name, nics, port_taken=False, gpu_query="", addresses=()):  # the two test nodes resolve
    return StandInEngine(name, nics, port_taken=port_taken, gpu_query=gpu_query, addresses=addresses, resolves=HOSTS)


@pytest.mark.parametrize(
    "nic, node_2_nics, port_taken, error",
    [
        ("ens5", ("lo", "ens5", "docker0"), False, None),
        (None, ("lo", "eth0"), False, None),
        (
            "ens5",
            ("lo", "eth0", "docker0"),
            False,
            "node_2: no network interface ens5 there (it has docker0, eth0, lo); "
            "pass --network-interface with one of them, or set "
            "NODE_NETWORK_INTERFACE in .env",
        ),
        ("ens5", ("lo", "ens5"), True, "node_2: port 12345 is already in use there"),
    ],
)
def test_nic_and_port_are_checked_before_any_worker_starts(nic, node_2_nics, port_taken, error):
    engines = [node_engine("node_1", ("lo", "ens5")), node_engine("node_2", node_2_nics, port_taken)]
    said: list[str] = []
    settings = launch_settings(nodes=("node_1", "node_2"), network_interface=nic)
    if error is None:
        nodechecks.check_nodes(settings, engines, say=said.append)
        assert "node_2: port 12345 free" + (f", NIC {nic} present" if nic else "") in said
        return
    with pytest.raises(LaunchError) as refused:
        launch.launch(settings, say=said.append, relay=said.append, connect=connect_to(*engines))
    assert str(refused.value).startswith(error)
    assert [d.started for d in engines] == [[], []]


H100 = "0, NVIDIA H100 80GB HBM3, 580.65.06, 9.0\n1, NVIDIA H100 80GB HBM3, 580.65.06, 9.0\n"


@pytest.mark.parametrize(
    "query, wanted, problem",
    [
        (H100, 2, None),
        (H100, 4, "only 2 GPU(s) visible to a container there, 4 asked for; pass a smaller --gpus"),
        ("0, NVIDIA A100-SXM4-40GB, 550.54.15, 8.0\n", 1, "NVIDIA driver 550.54.15 is older than 580"),
        (
            "0, Tesla V100-SXM2-16GB, 580.65.06, 7.0\n",
            1,
            "GPU 0 (Tesla V100-SXM2-16GB) has compute capability 7.0; "
            "torch's CUDA 13.0 build needs 7.5 or higher (Turing and later)",
        ),
        ("0, Odd GPU, [N/A], [N/A]\n", 1, "nvidia-smi's answer there could not be read"),
    ],
)
def test_gpus_are_checked_on_every_node_before_any_worker_starts(query, wanted, problem):
    engines = [node_engine("node_1", ("lo",), gpu_query=H100 * 2), node_engine("node_2", ("lo",), gpu_query=query)]
    settings = launch_settings(nodes=("node_1", "node_2"), gpus_per_node=wanted if problem else 2)
    if problem is None:
        nodechecks.check_nodes(settings, engines, say=lambda _: None)
        return
    with pytest.raises(LaunchError) as refused:
        launch.launch(settings, say=lambda _: None, relay=lambda _: None, connect=connect_to(*engines))
    assert str(refused.value).startswith(f"node_2: {problem}")
    assert [d.started for d in engines] == [[], []]


@pytest.mark.parametrize(
    "labels, query, problem",
    [
        ({FRAMEWORK_LABEL: "TensorFlow"}, "0, NVIDIA A100-SXM4-40GB, 550.54.15, 8.0\n", None),
        ({FRAMEWORK_LABEL: "TensorFlow"}, "0, Tesla V100-SXM2-16GB, 535.1, 7.0\n", None),
        ({FRAMEWORK_LABEL: "TensorFlow"}, "0, Tesla P100-PCIE-16GB, 535.1, 6.0\n", None),
        (
            {FRAMEWORK_LABEL: "TensorFlow"},
            "0, Tesla T4, 470.82.01, 7.5\n",
            "NVIDIA driver 470.82.01 is older than 525, "
            "which TensorFlow 2.21's CUDA 12.5 build needs; update the driver there",
        ),
        (
            {FRAMEWORK_LABEL: "TensorFlow"},
            "0, Tesla M60, 535.1, 5.2\n",
            "GPU 0 (Tesla M60) has compute capability 5.2; "
            "TensorFlow 2.21's CUDA 12.5 build needs 6.0 or higher (Pascal and later)",
        ),
        (
            {FRAMEWORK_LABEL: "PyTorch"},
            "0, NVIDIA A100-SXM4-40GB, 550.54.15, 8.0\n",
            "NVIDIA driver 550.54.15 is older than 580",
        ),
        (
            {},
            "0, NVIDIA A100-SXM4-40GB, 550.54.15, 8.0\n",
            "NVIDIA driver 550.54.15 is older than 580",
        ),  # a user's image
    ],
)
def test_each_images_framework_is_held_to_its_own_cuda_builds_needs(labels, query, problem):
    found = gpu.gpu_problem(query, 1, gpu.build_of(labels))
    assert (found is None) if problem is None else (found is not None and found.startswith(problem))


A100_550 = "0, NVIDIA A100-SXM4-40GB, 550.54.15, 8.0\n"


@pytest.mark.parametrize(
    "image, labels, query, problem",
    [
        ("horovod-stack:tensorflow", {FRAMEWORK_LABEL: "TensorFlow"}, A100_550, None),  # 550 >= TensorFlow's 525
        (
            "horovod-stack:tensorflow",
            {FRAMEWORK_LABEL: "TensorFlow"},
            "0, Tesla T4, 470.82.01, 7.5\n",
            "node_2: NVIDIA driver 470.82.01 is older than 525, which TensorFlow 2.21's CUDA 12.5 build needs",
        ),
        (
            "horovod-stack:latest",
            {FRAMEWORK_LABEL: "PyTorch"},
            A100_550,
            "node_2: NVIDIA driver 550.54.15 is older than 580, which torch's CUDA 13.0 build needs",
        ),
        (
            "my-lab/model:1",  # no label: held to PyTorch's
            {},
            A100_550,
            "node_2: NVIDIA driver 550.54.15 is older than 580, which torch's CUDA 13.0 build needs",
        ),
    ],
)
def test_doctor_gpus_holds_the_nodes_to_the_images_own_framework(image, labels, query, problem):
    """`launcher doctor --gpus` (and a start) read which framework --image holds from its label on the node."""
    engines = [
        StandInEngine(name, gpu_query=gpu_query, labels=labels, resolves=HOSTS)
        for name, gpu_query in (("node_1", H100), ("node_2", query))
    ]
    settings = launch_settings(nodes=("node_1", "node_2"), gpus_per_node=1, image=image)
    problems, _, _ = checkup.check(settings, lambda _: None, connect=connect_to(*engines))
    assert problems == ([] if problem is None else [f"{problem}; update the driver there"])


def test_gpus_named_by_id_are_checked_with_the_workers_own_request():
    engines = [node_engine("node_1", ("lo",), gpu_query=H100), node_engine("node_2", ("lo",), gpu_query=H100)]
    settings = launch_settings(nodes=("node_1", "node_2"), gpus_per_node=2, gpu_ids=("0", "1"))
    nodechecks.check_nodes(settings, engines, say=lambda _: None)
    plan = ClusterPlan.of(settings)
    assert [request for driver in engines for request in driver.gpu_requests] == [plan.gpu_request(plan.rank0)] * 2
    request = plan.gpu_request(plan.rank0)
    assert request is not None and request.device_ids == ("0", "1")


@pytest.mark.parametrize(
    "nic, nodes, expected",
    [
        (None, ("node_1", "node_2"), ("172.17.0.0/16", "172.26.0.0/16")),
        ("eth0", ("node_1", "node_2"), ()),  # a pinned NIC needs no exclusion
        (None, ("node_1",), ()),  # one host: ranks do not cross hosts
    ],
)
def test_an_unpinned_nic_across_hosts_leaves_every_nodes_virtual_subnets_out(nic, nodes, expected):
    node_1 = (("lo", "127.0.0.1/8"), ("eth0", "10.0.0.1/24"), ("docker0", "172.17.0.1/16"))
    node_2 = (
        ("lo", "127.0.0.1/8"),
        ("eth0", "10.0.0.2/24"),
        ("docker0", "172.17.0.1/16"),
        ("br-c33e5cb9fa8c", "172.26.0.1/16"),
    )
    engines = [
        node_engine("node_1", ("lo", "eth0", "docker0"), addresses=node_1),
        node_engine("node_2", ("lo", "eth0", "docker0", "br-c33e5cb9fa8c", "veth9a1"), addresses=node_2),
    ]
    settings = launch_settings(nodes=nodes, network_interface=nic)
    checked, _ = nodechecks.check_nodes(settings, engines[: len(nodes)], say=lambda _: None)
    assert checked.found.excluded_subnets == expected
    assert checked.job_spec().excluded_subnets == expected


def test_a_running_cluster_refuses_a_start_and_a_finished_one_is_named():
    node_1, node_2 = node_engine("node_1", ("lo",)), node_engine("node_2", ("lo",))
    node_2.cluster_containers = lambda cluster_id=None: [container("old", "5ca1ab1e", running=False)]  # type: ignore
    said: list[str] = []
    nodechecks.check_nodes(launch_settings(nodes=("node_1", "node_2")), [node_1, node_2], say=said.append)
    assert (
        "node_2: finished cluster 5ca1ab1e is kept for `launcher status` and `launcher logs`; `launcher stop "
        "--nodes node_1,node_2 --cluster 5ca1ab1e` removes it"
    ) in said
    node_1.cluster_containers = lambda cluster_id=None: [container("job", "c0ffee00")]  # type: ignore
    with pytest.raises(LaunchError) as refused:
        launch.launch(
            launch_settings(nodes=("node_1", "node_2")),
            say=said.append,
            relay=said.append,
            connect=connect_to(node_1, node_2),
        )
    assert str(refused.value) == (
        "node_1: cluster c0ffee00 is still running; stop it first with `launcher stop "
        "--nodes node_1,node_2 --cluster c0ffee00`"
    )


def test_doctor_prints_every_finding_and_counts_the_problems_a_start_would_refuse():
    node_1 = node_engine("node_1", ("lo", "eth0"))
    node_2 = node_engine("node_2", ("lo", "ens5"), port_taken=True)
    printed: list[str] = []
    settings = launch_settings(nodes=("node_1", "node_2"), network_interface="eth0")
    problems, engines, views = checkup.check(settings, printed.append, connect=connect_to(node_1, node_2))
    assert "node_1: engine        ok (26.1.5 at ssh://node_1)" in printed
    assert "node_1: network iface ok (eth0)" in printed and "node_1: ssh port      ok free (12345)" in printed
    assert (
        "node_2: ssh port      FAIL port 12345 is already in use there; free it or pass --ssh-port with a free port"
    ) in printed
    assert problems == [
        "node_2: no network interface eth0 there (it has ens5, lo); pass --network-interface with one of them, or set "
        "NODE_NETWORK_INTERFACE in .env",
        "node_2: port 12345 is already in use there; free it or pass --ssh-port with a free port",
    ]
    assert [engine.node.name for engine in engines] == ["node_1", "node_2"] and set(views) == {"node_1", "node_2"}


@pytest.mark.parametrize("skew, severity", [(0.4, Severity.OK), (-7.0, Severity.WARNING)])
def test_clock_skew_is_a_warning_doctor_fails_on_and_a_start_only_says(skew, severity):
    facts = NodeFacts("node_1", "ssh://node_1", version="26.1.5", image_id="sha256:0123456789abcdef", clock_skew=skew)
    [finding] = [f for f in preflight.check_node(launch_settings(), facts) if f.check == "clock skew"]
    assert finding.severity is severity and (finding.ok == (severity is Severity.OK))


def test_a_dry_run_prints_every_finding_with_the_plan_and_refuses_with_the_first_problem():
    node_1, node_2 = node_engine("node_1", ("lo", "eth0")), node_engine("node_2", ("lo", "eth0"))
    out = io.StringIO()
    launch.dry_run(
        launch_settings(nodes=("node_1", "node_2"), network_interface="eth0"),
        say=lambda _: None,
        out=out,
        connect=connect_to(node_1, node_2),
    )
    checks, plan = out.getvalue().split("plan: ", 1)
    assert checks.splitlines()[:3] == [
        "checks:",
        "  node_1: engine        ok (26.1.5 at ssh://node_1)",
        "  node_1: image         ok (0123456789ab)",
    ]
    assert "  node_2: ssh port      ok free (12345)" in checks and plan.startswith("2 ranks on 2 node(s)")
    busy = node_engine("node_2", ("lo", "ens5"), port_taken=True)
    out = io.StringIO()
    with pytest.raises(LaunchError) as refused:
        launch.dry_run(
            launch_settings(nodes=("node_1", "node_2"), network_interface="eth0"),
            say=lambda _: None,
            out=out,
            connect=connect_to(node_1, busy),
        )
    assert str(refused.value).startswith("node_2: no network interface eth0 there (it has ens5, lo)")
    assert "node_2: ssh port      FAIL port 12345 is already in use there" in out.getvalue()  # both, at once
    assert "plan: " not in out.getvalue() and node_1.started == busy.started == []


def test_push_image_from_a_machine_without_the_image_is_a_finding():
    facts = NodeFacts("this machine", "local")
    [finding] = preflight.push_source_findings(launch_settings(), facts)
    assert finding.severity is Severity.BLOCKING
    assert finding.line() == (
        "this machine: no image horovod-stack:latest either, and --push-image copies it from "
        "here; build it with scripts/build-images.sh"
    )
    assert (
        preflight.push_source_findings(launch_settings(), NodeFacts("this machine", "local", image_id="sha256:1")) == []
    )


def test_a_running_cluster_is_named_before_another_nodes_missing_image():
    node_1, node_2 = node_engine("node_1", ("lo",)), node_engine("node_2", ("lo",))
    node_1.image = None
    node_2.cluster_containers = lambda cluster_id=None: [container("job", "c0ffee00")]  # type: ignore
    with pytest.raises(LaunchError) as refused:
        nodechecks.check_nodes(launch_settings(nodes=("node_1", "node_2")), [node_1, node_2], say=lambda _: None)
    assert str(refused.value).startswith("node_2: cluster c0ffee00 is still running")


def test_a_node_name_rank_0_cannot_resolve_blocks_with_an_etc_hosts_line_and_a_peer_gap_is_a_warning():
    # node_1 (rank 0) knows node_2 by no name; node_2's workers cannot look node_3 up; node_2 knows node_2's address.
    node_1 = StandInEngine("node_1", ("lo", "eth0"), resolves={"node_1": "10.0.0.1", "node_3": "10.0.0.3"})
    node_2 = StandInEngine("node_2", ("lo", "eth0"), resolves={"node_1": "10.0.0.1", "node_2": "10.0.0.2"})
    node_3 = StandInEngine("node_3", ("lo", "eth0"), resolves={**HOSTS, "node_3": "10.0.0.3"})
    printed: list[str] = []
    settings = launch_settings(nodes=("node_1", "node_2", "node_3"))
    problems, _, _ = checkup.check(settings, printed.append, connect=connect_to(node_1, node_2, node_3))
    assert problems == [
        "node_1: node_2 does not resolve there (mpirun there reaches every node by its name); add to DNS or to "
        "/etc/hosts on node_1 (the workers read the host's): `10.0.0.2 node_2`",
        "node_2: node_3 does not resolve there (ranks there may look a peer up); add to DNS or to /etc/hosts on node_2 "
        "(the workers read the host's): `10.0.0.3 node_3`",
    ]
    assert "node_3: names         ok (all 3 node names resolve)" in printed
    with pytest.raises(LaunchError, match="^node_1: node_2 does not resolve there"):
        launch.launch(settings, say=printed.append, relay=printed.append, connect=connect_to(node_1, node_2, node_3))
    assert [engine.started for engine in (node_1, node_2, node_3)] == [[], [], []]


def test_nodes_that_share_a_host_name_are_told_apart_by_their_workers_own():
    engines: list[NodeEngine] = [
        StandInEngine(name, ("lo", "eth0"), resolves=HOSTS, host_name="ubuntu") for name in HOSTS
    ]
    said: list[str] = []
    plan, findings = nodechecks.check_nodes(launch_settings(nodes=tuple(HOSTS)), engines, say=said.append)
    assert (
        "node_1, node_2: share the host name ubuntu: each worker gets its own (node-1, node-2), so Open MPI tells "
        "the nodes apart"
    ) in said
    containers = [plan.worker_container(node) for node in plan.nodes]
    assert [container.hostname for container in containers] == ["node-1", "node-2"]
    # Every worker's /etc/hosts names every worker, at the address rank 0 resolved for its node.
    assert all(container.extra_hosts == {"node-1": "10.0.0.1", "node-2": "10.0.0.2"} for container in containers)


LAUNCHER_COMMAND = re.compile(r"`launcher ([a-z]+)((?: [^`;]*)?)`")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*[a-z]")


def fix_problems(text: str, printed_by: tuple[str, ...]) -> list[str]:
    """Why a printed fix names what the CLI lacks: each `launcher COMMAND ...` in it parsed by that command's own
    parser (click's, as typer carries it), each other --flag looked up in every command that prints the fix."""
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    problems = []
    for name, rest in LAUNCHER_COMMAND.findall(text):
        command = group.commands.get(name)
        if command is None:
            problems.append(f"`launcher {name}`: no such command")
            continue
        try:
            command.make_context(name, rest.split())
        except UsageError as error:
            problems.append(f"`launcher {name}{rest}`: {error.format_message()}")
    for flag in FLAG.findall(LAUNCHER_COMMAND.sub("", text)):
        for name in printed_by:
            context = group.commands[name].make_context(name, [], resilient_parsing=True)
            if flag not in {opt for param in group.commands[name].get_params(context) for opt in param.opts}:
                problems.append(f"{flag}: not an option of `launcher {name}`")
    return problems


def printed_fixes() -> list[tuple[str, tuple[str, ...]]]:
    """Every fix the checks print, from where each is defined, with the commands that print it: the preflight checks'
    table (start, its --dry-run and doctor alike), the NIC rules', a failed pull's and doctor's own."""
    both = ("start", "doctor")
    fields = {"nodes": "node_1,node_2", "cluster": "5ca1ab1e", "node": "node_1", "example": "`10.0.0.2 node_2`"}
    return [
        *((fix.format(**fields), both) for fix in preflight.FIXES.values()),
        (nics.nic_problem("ens5", ("lo", "eth0")) or "", both),
        (nics.subnet_problem("10.9.9.0/24", (("eth0", "10.0.0.1/24"),)) or "", both),
        *(
            (pull_failure("node_1", "registry.example/team/horovod-stack:1", why), ("start",))  # a start's pull
            for why in ("dial tcp: no such host", "unauthorized", "manifest unknown", "disk full")
        ),
        (checkup.link_options_problem(False, 1.0, None) or "", ("doctor",)),
        (checkup.link_options_problem(True, -1.0, None) or "", ("doctor",)),
    ]


@pytest.mark.parametrize("fix, printed_by", printed_fixes())
def test_every_fix_a_check_prints_names_a_command_or_flag_that_exists(fix, printed_by):
    assert fix and fix_problems(fix, printed_by) == []


def test_a_fix_naming_a_flag_or_command_the_cli_lacks_is_reported():
    assert fix_problems("pass --links or run `launcher stop --nodes a --cluster 1`", ("doctor",)) == []
    assert fix_problems("pass --links", ("start",)) == ["--links: not an option of `launcher start`"]
    assert fix_problems("`launcher stop --nodes a --clusters 1`; `launcher halt`", ("start",)) == [
        "`launcher stop --nodes a --clusters 1`: No such option: --clusters (Possible options: --cluster)",
        "`launcher halt`: no such command",
    ]


@pytest.mark.parametrize("source_image", [IMAGE_ID, None])
def test_doctor_with_push_image_copies_the_image_first_so_every_check_runs_on_every_node(monkeypatch, source_image):
    """The docs' order on nodes that lack the image: `launcher doctor --push-image` copies it from this machine (only
    to the node that lacks it), then the checks that run in its containers run there too; without the image here,
    the copy's source is the one problem."""
    node_1, node_2 = node_engine("node_1", ("lo", "eth0")), node_engine("node_2", ("lo", "eth0"))
    node_2.image = None
    here = StandInEngine("this machine", chunks=[b"layer"], image=source_image)
    monkeypatch.setattr(nodechecks, "this_machine", lambda image: (here, here.image))
    printed: list[str] = []
    settings = launch_settings(nodes=("node_1", "node_2"), network_interface="eth0", push_image=True)
    problems, _, views = checkup.check(settings, printed.append, connect=connect_to(node_1, node_2))
    if source_image is None:
        assert problems == [
            f"this machine: no image {settings.image} either, and --push-image copies it from here; "
            "build it with scripts/build-images.sh"
        ]
        assert (
            "node_2: image         note lacks horovod-stack:latest; a start copies it there from this machine"
            in printed
        )
        assert node_2.loaded == [] and set(views) == {"node_1"}
        return
    assert problems == [] and node_1.loaded == [] and node_2.loaded == [b"layer"]
    assert "node_2: image         ok (0123456789ab)" in printed and "node_2: ssh port      ok free (12345)" in printed
    assert set(views) == {"node_1", "node_2"}  # the links can be measured now
