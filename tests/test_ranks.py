"""Ranks per node, one rule for every launch method (launcher/core/ranks.py): the launcher (--slots, --gpus), compose
(SLOTS_PER_WORKER, GPUS) and the MPIJob export (--slots, --gpus-per-node) give the same answer, or the same refusal
in their own words.
"""

from __future__ import annotations

import re

import pytest

from launcher.agent import compose
from launcher.core.options import SettingsError
from launcher.core.ranks import COMPOSE, LAUNCHER, MPIJOB, ranks_per_node, ranks_problem
from launcher.host.planning.settings import resolve_settings
from launcher.k8s import mpijob, mpijob_request

REFUSED = "a GPU worker runs one rank per GPU"

RULE = [
    # slots given, GPUs, ranks per node (or the refusal's words)
    (None, 0, 1),  # nothing given: one CPU rank
    (3, 0, 3),  # CPU ranks: the slots
    (None, 4, 4),  # GPUs imply the slots: one rank per GPU
    (4, 4, 4),  # slots given beside GPUs, the same count
    (2, 4, REFUSED),  # a different count is refused, not replaced
    (1, 4, REFUSED),
    (0, 0, "a worker runs at least 1 rank"),
    (None, -1, "give 0 (CPU ranks) or more"),
]


@pytest.mark.parametrize("slots, gpus, ranks", RULE)
def test_the_rule(slots, gpus, ranks):
    for names in (LAUNCHER, COMPOSE, MPIJOB):
        if isinstance(ranks, int):
            assert ranks_per_node(slots, gpus, names) == ranks and ranks_problem(slots, gpus, names) is None
        else:
            with pytest.raises(SettingsError, match=re.escape(ranks)):
                ranks_per_node(slots, gpus, names)


@pytest.mark.parametrize(
    "names, expected",
    [
        (
            LAUNCHER,
            "--slots 2 with --gpus 4: a GPU worker runs one rank per GPU; drop --slots (or SLOTS_PER_WORKER in "
            ".env), or give it the GPU count",
        ),
        (
            COMPOSE,
            "SLOTS_PER_WORKER=2 with GPUS=4: a GPU worker runs one rank per GPU; drop SLOTS_PER_WORKER from .env, "
            "or set it to GPUS",
        ),
        (MPIJOB, "--slots 2 with --gpus-per-node 4: a GPU worker runs one rank per GPU; drop --slots"),
    ],
)
def test_each_launch_method_words_the_refusal_in_one_line_naming_the_fix(names, expected):
    assert ranks_problem(2, 4, names) == expected


def launcher_ranks(slots, gpus):
    settings = resolve_settings({"NODES": "a,b"}, slots=slots, gpus=str(gpus) if gpus else None)
    return settings.ranks_per_node


def compose_ranks(slots, gpus):
    environ = {"SLOTS_PER_WORKER": "" if slots is None else str(slots), **({"GPUS": str(gpus)} if gpus else {})}
    return compose.job_spec({"NETWORK_INTERFACE": "eth0", **environ}, []).slots


def export_ranks(slots, gpus):
    request = mpijob_request.request(
        {"command": ("python", "t.py")},
        name="j",
        workers=2,
        image="registry.example/i:1",
        slots=slots,
        gpus_per_node=gpus,
    )
    return mpijob.document(request)["spec"]["slotsPerWorker"]


@pytest.mark.parametrize("launch_method", [launcher_ranks, compose_ranks, export_ranks])
@pytest.mark.parametrize("slots, gpus, ranks", [row for row in RULE if row[0] != 0 and row[1] >= 0])
def test_every_launch_method_follows_the_rule(launch_method, slots, gpus, ranks):
    if isinstance(ranks, int):
        assert launch_method(slots, gpus) == ranks
    else:
        with pytest.raises(SettingsError, match=re.escape(ranks)):
            launch_method(slots, gpus)
