"""The packages' import rules, read from the source (ast), so an import that breaks one fails here and not in review:
launcher/core/ imports no side; the agent (and the smoke role, which runs beside it in the containers) never
imports the host side; the Kubernetes and Slurm exports read only core; inside the host side, planning <- engines <-
running <- doctor (each package reads only those before it); nothing imports the command line (launcher/cli.py, the
face on top); app/ (the trainer, in every rank) never imports launcher; and no two modules import each other, even by
way of others.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SIDES = ("launcher.host", "launcher.agent", "launcher.k8s", "launcher.slurm", "launcher.smoke", "launcher.cli")

RULES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("launcher.core", SIDES, "core is what every side reads: it imports none of them"),
    ("launcher.agent", ("launcher.host", "launcher.cli"), "the agent runs in the containers: no host side there"),
    ("launcher.smoke", ("launcher.host", "launcher.cli"), "the smoke role runs in the containers: no host side there"),
    (
        "launcher.k8s",
        ("launcher.agent", "launcher.host", "launcher.slurm", "launcher.smoke", "launcher.cli"),
        "the MPIJob document reads only core (the launcher pod's arguments: core/pod_contract.py)",
    ),
    (
        "launcher.slurm",
        ("launcher.agent", "launcher.host", "launcher.k8s", "launcher.smoke", "launcher.cli"),
        "the batch script reads only core",
    ),
    (
        "launcher.host",
        ("launcher.agent", "launcher.k8s", "launcher.slurm", "launcher.smoke", "launcher.cli"),
        "the host side reads core; the command line alone calls the other launch methods",
    ),
    (
        "launcher.host.planning",
        ("launcher.host.engines", "launcher.host.running", "launcher.host.doctor"),
        "what to run is decided before any engine is asked: planning reads no other host package",
    ),
    (
        "launcher.host.engines",
        ("launcher.host.running", "launcher.host.doctor"),
        "an engine answers in its own records: engines read only planning's (a Node, a WorkerContainer)",
    ),
    ("launcher.host.running", ("launcher.host.doctor",), "doctor runs a start's checks, never the other way round"),
    ("launcher", ("launcher.cli",), "launcher/cli.py is the face on top: nothing imports it"),
    ("app", ("launcher",), "the trainer runs in every rank, without the launcher"),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(module: str, source: str) -> set[str]:
    """Every module `source` imports, anywhere in it (a function's own imports too), as absolute names; `from X
    import Y` counts as X.Y as well, since Y may be a module."""
    package = module if module.count(".") == 0 else module.rsplit(".", 1)[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def rule_problems(module: str, source: str) -> list[str]:
    """Each rule `module`'s imports break, one line each."""
    problems = []
    for room, forbidden, why in RULES:
        if not within(module, room) or (room == "launcher" and module == "launcher.cli"):
            continue
        for name in sorted(imported(module, source)):
            if any(within(name, other) for other in forbidden) and not within(name, room):
                problems.append(f"{module} imports {name}: {why}")
    return problems


def sources() -> dict[str, str]:
    return {
        module_name(path): path.read_text()
        for folder in ("launcher", "app")
        for path in sorted((REPO / folder).rglob("*.py"))
    }


def test_every_module_keeps_the_rooms_import_rules():
    problems = [problem for module, source in sources().items() for problem in rule_problems(module, source)]
    assert problems == []


@pytest.mark.parametrize(
    "module, source, broken",
    [
        ("launcher.core.jobspec", "from launcher.host.planning.plan import Node", True),
        ("launcher.core.jobspec", "def f():\n    from launcher.agent import stacks", True),
        ("launcher.core.jobspec", "from launcher.core.nics import own_nic", False),
        ("launcher.agent.job", "import launcher.host.engines.node_engine", True),
        ("launcher.agent.job", "from launcher import cli", True),
        ("launcher.agent.job", "from launcher.core import stall", False),
        ("launcher.k8s.mpijob", "from launcher.agent.job import Agent", True),
        ("launcher.k8s.mpijob", "from launcher.core.pod_contract import agent_args", False),
        ("launcher.host.planning.plan", "from launcher.cli import app", True),
        ("launcher.host.planning.plan", "from launcher.agent import compose", True),
        ("launcher.host.planning.plan", "from launcher.host.engines.reach import probe", True),
        ("launcher.host.planning.plan", "from launcher.host.running import launch", True),
        ("launcher.host.planning.plan", "from ..engines import images", True),
        ("launcher.host.planning.plan", "from launcher.host.planning.access import EngineTls", False),
        ("launcher.host.engines.images", "from launcher.host.running.rootcause import LaunchError", True),
        ("launcher.host.engines.images", "from launcher.host.doctor import checkup", True),
        ("launcher.host.engines.images", "from launcher.host.planning.plan import Node", False),
        ("launcher.host.running.launch", "from launcher.host.doctor.checkup import verdict", True),
        ("launcher.host.running.launch", "from launcher.host.engines import images", False),
        ("launcher.host.doctor.checkup", "from launcher.host.running import nodechecks", False),
        ("launcher.cli", "from launcher.k8s import mpijob", False),
        ("app.train", "from launcher.core.protocol import RUNS_DIR", True),
        ("app.train", "from app.config import parse", False),
        ("launcher.core.jobspec", "from . import nics", False),
        ("launcher.core.jobspec", "from ..host import plan", True),
    ],
)
def test_a_broken_rule_is_named(module, source, broken):
    assert bool(rule_problems(module, source)) is broken


HOST_ORDER = ("planning", "engines", "running", "doctor")
"""The host side's packages, each reading only those before it (the rules above)."""


def test_every_host_module_is_in_a_package_the_rules_order():
    host = REPO / "launcher" / "host"
    loose = sorted(path.name for path in host.glob("*.py") if path.name != "__init__.py")
    packages = sorted(path.parent.name for path in host.glob("*/__init__.py"))
    assert loose == [], "a module of launcher/host/ belongs in one of its packages"
    assert packages == sorted(HOST_ORDER)
    for index, package in enumerate(HOST_ORDER[:-1]):
        later = tuple(f"launcher.host.{name}" for name in HOST_ORDER[index + 1 :])
        assert (f"launcher.host.{package}", later) in {(room, forbidden) for room, forbidden, _ in RULES}


def test_no_module_imports_itself_by_way_of_others():
    modules = sources()
    graph = {
        module: {name for name in imported(module, source) if name in modules and name != module}
        for module, source in modules.items()
    }
    # A package's __init__ is imported with its modules; it is no edge back to them.
    graph = {module: {name for name in names if not within(module, name)} for module, names in graph.items()}
    circles = []
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for name in sorted(graph[module]):
            if state.get(name) == 1:
                circles.append(" -> ".join([*path[path.index(name) :], name]))
            elif name not in state:
                visit(name, [*path, name])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []


TRAIN_EXTRA = ("numpy", "torch", "torchvision", "tensorboard", "matplotlib", "sklearn", "horovod", "cloudpickle")
"""What a contributor's `pip install -e '.[test]'` lacks: the train extra's packages, Horovod and its dependencies."""


def early_train_extra_imports(source: str) -> list[str]:
    """`line: module` for each top-level import of a TRAIN_EXTRA package that no skip_module_without call before it
    names (tests/extras.py): where the package is missing, such a module errors instead of skipping."""
    named: set[str] = set()
    early = []
    for node in ast.parse(source).body:
        call = node.value if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) else None
        if call is not None and isinstance(call.func, ast.Name) and call.func.id == "skip_module_without":
            named |= {arg.value for arg in call.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)}
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        early += [
            f"{node.lineno}: {m}" for m in modules if m.split(".")[0] in TRAIN_EXTRA and m.split(".")[0] not in named
        ]
    return early


def test_a_test_module_imports_the_train_extra_only_after_skipping_without_it():
    early = {
        path.name: found
        for path in sorted((REPO / "tests").glob("test_*.py"))
        if (found := early_train_extra_imports(path.read_text()))
    }
    assert early == {}
    sample = 'import numpy\nskip_module_without("torch")\nimport torch.nn\nfrom horovod import torch as hvd\n'
    assert early_train_extra_imports(sample) == ["1: numpy", "4: horovod"]
