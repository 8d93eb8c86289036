"""The rank tag on a job's output lines, the one place its format is known: mpirun's `--tag-output` (`[1,3]<stdout>:`,
`[JOBID,RANK]<STREAM>:`, STREAM also stddiag for Open MPI's own diagnostics) and elastic horovodrun's (`[3]<stderr>:`),
both written straight before the rank's own text. Open MPI 5 (PRRTE) writes a space after the colon and may give the job
as a namespace (`[prterun-host-4242@1,3]<stdout>: ...`): its ranks are read too, and the space stays with the text (the
image's Open MPI 4.1 writes none, and a rank's own leading spaces, as in a traceback, are its text). A rank's text that
reached mpirun in pieces (a long stderr line written in several writes, as Horovod's stall warning on a busy node)
carries its tag again before each piece, inside the line: those are taken off too. Every reader of a job's output goes
through here: which rank wrote a line (launcher/host/running/ranklogs.py, the smoke role), and what the rank wrote, for
the readers of the ranks' error records (launcher/agent/rank_errors.py, launcher/smoke/output.py), Keras 2 code on Keras
3 and Horovod's stall warnings. Pure.
"""

from __future__ import annotations

import re

TAG_OUTPUT = "--tag-output"
"""mpirun's flag that tags every line a rank writes (the job's mpirun line carries it: launcher/core/jobspec.py)."""
_TAG = r"\[(?:[^\[\],<>]+,)?(\d+)\]<(stdout|stderr|stddiag)>:"
RANK_TAG = re.compile("^" + _TAG)
"""mpirun's --tag-output prefix ([JOBID,RANK]<stream>:) or horovodrun's ([RANK]<stream>:)."""
TAG_WITHIN = re.compile(_TAG)


def split_tag(line: str) -> tuple[int, str, str] | None:
    """(rank, stream, the rank's own text) of a tagged line; None for a line without a tag."""
    found = RANK_TAG.match(line)
    if not found:
        return None
    rank, stream = int(found[1]), found[2]

    def own_piece(tag: re.Match[str]) -> str:  # the same rank and stream again: a piece of the same line
        return "" if (int(tag[1]), tag[2]) == (rank, stream) else tag[0]

    return rank, stream, TAG_WITHIN.sub(own_piece, line[found.end() :])


def tagged_rank(line: str) -> int | None:
    """The rank whose tag `line` carries, or None."""
    tagged = split_tag(line)
    return tagged[0] if tagged else None


def untagged(line: str) -> str:
    """The line as its rank wrote it: the tag taken off, where it has one."""
    tagged = split_tag(line)
    return tagged[2] if tagged else line
