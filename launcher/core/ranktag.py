"""The rank tag on a job's output lines, the one place its format is known: mpirun's `--tag-output`
(`[1,3]<stdout>:`, `[JOBID,RANK]<STREAM>:`) and elastic horovodrun's (`[3]<stderr>:`), both written straight before
the rank's own text. Every reader of a job's output goes through here: which rank wrote a line
(launcher/host/ranklogs.py, the smoke role), and what the rank wrote, for the parsers of the job's progress, its
root cause and Horovod's stall warnings. Pure.
"""

from __future__ import annotations

import re

TAG_OUTPUT = "--tag-output"
"""mpirun's flag that tags every line a rank writes (the job's mpirun line carries it: launcher/core/job.py)."""
RANK_TAG = re.compile(r"^\[(?:\d+,)?(\d+)\]<(stdout|stderr)>:")
"""mpirun's --tag-output prefix ([JOBID,RANK]<stream>:) or horovodrun's ([RANK]<stream>:)."""


def split_tag(line: str) -> tuple[int, str, str] | None:
    """(rank, stream, the rank's own text) of a tagged line; None for a line without a tag."""
    found = RANK_TAG.match(line)
    return (int(found[1]), found[2], line[found.end() :]) if found else None


def tagged_rank(line: str) -> int | None:
    """The rank whose tag `line` carries, or None."""
    tagged = split_tag(line)
    return tagged[0] if tagged else None


def untagged(line: str) -> str:
    """The line as its rank wrote it: the tag taken off, where it has one."""
    tagged = split_tag(line)
    return tagged[2] if tagged else line
