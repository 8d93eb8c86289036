"""Horovod's records of a job, summarised at its end by the job agent: where the run's timeline (--timeline) and
autotune log (--autotune) are, each with what it shows in one line (app/timeline.py, app/autotune.py), and the
autotuner's choice written beside its log.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from app import autotune, timeline
from launcher.agent.transport import Transport
from launcher.core.jobspec import JobSpec
from launcher.core.options import names_in

TIMELINE_SUMMARY_BYTES = 256 << 20
"""A timeline larger than this is named but not summarised at the job's end (its parse would take the agent's
memory and minutes)."""


def horovod_records(spec: JobSpec, transport: Transport, say: Callable[[str], None]) -> None:
    """Says where the run's timeline and autotune log are (--timeline, --autotune), each with what it shows in one
    line; the autotuner's choice is also written beside its log (autotune.json). A record the user's own --env sent
    elsewhere is theirs."""
    folder = spec.output_dir
    user_set = names_in(spec.options.env)
    if not folder:
        return
    if spec.options.timeline and "HOROVOD_TIMELINE" not in user_set:
        path = f"{folder}/{timeline.FILE}"
        text = transport.read(path)
        if not text:
            say(f"timeline: rank 0 wrote no {path} (the job ended before Horovod started)")
        else:
            try:
                small = len(text) <= TIMELINE_SUMMARY_BYTES
                shows = timeline.summarize(timeline.parse(text)).line() if small else ""
            except (ValueError, KeyError, TypeError):
                shows = ""
            say(
                f"timeline: {path}{f': {shows}' if shows else ''}; open it in https://ui.perfetto.dev or "
                "chrome://tracing"
            )
    if spec.options.autotune and "HOROVOD_AUTOTUNE_LOG" not in user_set:
        log = transport.read(f"{folder}/{autotune.LOG}")
        record = autotune.read_log(log or "")
        transport.write(f"{folder}/{autotune.RECORD}", json.dumps(record, indent=1) + "\n")
        say(f"{autotune.line(record)}; {folder}/{autotune.RECORD}")
