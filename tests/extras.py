"""What some unit tests need beyond `pip install -e '.[test]'`: the train extra's packages (torch, numpy, matplotlib,
tensorboard) or Horovod and its dependencies, which scripts/setup.sh's .venv holds. Where one is missing, the test
(or the whole module) is skipped, naming it (`pytest -rs` lists them), rather than erroring."""

from __future__ import annotations

import importlib.util

import pytest

WHERE = "pip install -e '.[train]', or scripts/setup.sh's .venv"


def reason(absent: list[str]) -> str:
    return f"needs {', '.join(absent)} ({WHERE})"


def needs(*modules: str) -> pytest.MarkDecorator:
    """A mark that skips the test (as `pytestmark`, the module) where any of `modules` is not installed."""
    absent = [name for name in modules if importlib.util.find_spec(name) is None]
    return pytest.mark.skipif(bool(absent), reason=reason(absent))


def skip_module_without(*modules: str) -> None:
    """Called before a test module's imports of `modules`: skips the whole module where any is not installed."""
    for name in modules:
        pytest.importorskip(name, reason=reason([name]))
