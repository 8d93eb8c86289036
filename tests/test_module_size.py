"""Every module of the project's own code (app/, launcher/, examples/, docker/) stays within 500 lines: one job each,
readable in one sitting. A module that grows past it is split by what it does, not trimmed."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MOST_LINES = 500
MODULES = sorted(path for folder in ("app", "launcher", "examples", "docker") for path in (ROOT / folder).rglob("*.py"))


def test_the_modules_are_found():
    assert len(MODULES) > 100 and ROOT / "launcher" / "core" / "options.py" in MODULES


@pytest.mark.parametrize("module", MODULES, ids=lambda path: str(path.relative_to(ROOT)))
def test_a_module_stays_within_500_lines(module: Path):
    lines = len(module.read_text().splitlines())
    assert lines <= MOST_LINES, f"{module.relative_to(ROOT)} has {lines} lines: split it by what each part does"
