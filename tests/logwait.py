"""Waiting for a line in the output of a process the tests started (the launcher, compose), written to a file."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def wait_for_line(log: Path, text: str, process: subprocess.Popen, timeout: float) -> float:
    """Waits until `text` is in the log, failing if the process ends first or the timeout passes; returns when it
    was seen (time.monotonic)."""
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert process.poll() is None, f"{process.args!r} ended before {text!r}:\n{log.read_text()[-5000:]}"
        assert time.monotonic() < deadline, f"no {text!r} within {timeout} s:\n{log.read_text()[-5000:]}"
        time.sleep(0.1)
    return time.monotonic()
