"""How the Slurm test cluster reads a job's end from `sacct` (tests/slurmcluster.py `accounted`), table-tested."""

from __future__ import annotations

import pytest

from tests.slurmcluster import accounted

START = "2026-12-06T12:32:58"


def fields(name: str, state: str, code: str, nodes: str = "node[1-2]", start: str = START) -> dict[str, str]:
    return {"JobName": name, "State": state, "ExitCode": code, "NodeList": nodes, "Submit": start}


@pytest.mark.parametrize(
    ("shown", "expected"),
    [
        ("", {}),
        ("\n", {}),
        (f"pytorch-2x1|COMPLETED|0:0|node[1-2]|{START}\n", fields("pytorch-2x1", "COMPLETED", "0:0")),
        (f"cancelled|CANCELLED by 1000|0:15|node[1-2]|{START}\n", fields("cancelled", "CANCELLED", "0:15")),
        (f"fails|RUNNING|0:0|node[1-2]|{START}", fields("fails", "RUNNING", "0:0")),
        (
            f"requeued|REQUEUED|0:0|node1|2026-12-06T12:30:00\nrequeued|FAILED|1:0|node[1-2]|{START}\n",
            fields("requeued", "FAILED", "1:0"),
        ),
        ("pending|PENDING|0:0|None assigned|2026-12-06T12:32:58", fields("pending", "PENDING", "0:0", "None assigned")),
    ],
    ids=["nothing", "blank", "completed", "cancelled-by", "running", "newest-line", "pending"],
)
def test_accounted_reads_the_newest_line_and_the_states_first_word(shown, expected):
    assert accounted(shown) == expected
