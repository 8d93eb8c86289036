"""How one launch method's users write a job's options (a flag, a settings file's key), for the errors that name them:
launcher/core/options.py's OPTION_NAMES holds each launch method's. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class OptionNames:
    """How one launch method's users write each option, for its errors: a flag (`--ssh-port 70000`, fixed by passing it
    again) or a settings file's key (`SSH_PORT=70000`, fixed in .env)."""

    names: Mapping[str, str]
    """JobOptions field -> how it is set (`--ssh-port`, `SSH_PORT`); "workers": what counts the launch method's
    workers."""
    flag_fix: str = "pass {name} with one that is"

    def of(self, option: str, value: object = None) -> str:
        name = self.names.get(option, option)
        if value is None:
            return name
        return f"{name} {value}" if name.startswith("-") else f"{name}={value}"

    def fix_for(self, option: str) -> str:
        name = self.of(option)
        return self.flag_fix.format(name=name) if name.startswith("-") else "fix it in .env"
