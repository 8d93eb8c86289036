"""The bundled trainer's metrics file (metrics.jsonl, one JSON record per epoch) as the launcher's sides read it: the
host side for `launcher status`, the job agent for the epoch a restart resumes after."""

from __future__ import annotations

import json
from collections.abc import Collection


def last_record(metrics_text: str | None, fields: Collection[str]) -> dict | None:
    """The last complete record holding `fields` (a line being written as it is read, or cut short by a kill, is
    skipped); None without one."""
    for line in reversed((metrics_text or "").splitlines()):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and set(fields) <= set(record):
            return record
    return None
