"""Keras 2 code on Keras 3, said as such: the one rule behind every launch method's failure line for it (the job agent's
cause, which `launcher start`, compose, an MPIJob's launcher and `launcher status` show; the smoke role's last line).
Pure.

horovod-stack:tensorflow runs Keras 3, TensorFlow 2.21's default; Keras 2 is there as well (tf_keras), for ranks
whose environment has TF_USE_LEGACY_KERAS=1. Code written for Keras 2, as Horovod's own TensorFlow 2 examples are
(`opt = tf.optimizers.SGD(...)`, then `hvd.broadcast_variables(opt.variables(), root_rank=0)`), dies on Keras 3 with
`TypeError: 'list' object is not callable` and nothing else: a Keras 3 optimizer's `variables` is a list, where Keras
2's is a list that can also be called.

The rule reads one rank's output, each line as the rank wrote it (launcher/core/ranktag.py takes mpirun's tags off):
that TypeError, raised in a line that calls `.variables()` (the innermost frame the traceback shows: Python's own,
or, from a @tf.function, the frame TensorFlow shows under `TypeError: in user code:`), in a traceback that does not
run through tf_keras, and Keras 2 not asked for (TF_USE_LEGACY_KERAS=1 among the ranks' KEY=VALUE words). Any other
TypeError, and this one raised anywhere else, stays as it is.
"""

from __future__ import annotations

import re
import shlex
from collections import deque
from collections.abc import Iterable, Sequence

from app.frameworks import TENSORFLOW
from launcher.core.ranktag import split_tag

VARIABLE = "TF_USE_LEGACY_KERAS"
SETTING = f"{VARIABLE}=1"
KERAS2_VALUES = frozenset({"1", "true", "True"})
"""The values of VARIABLE with which TensorFlow's tf.keras is Keras 2 (tf_keras)."""
ERROR = "TypeError: 'list' object is not callable"
"""Python's error for a list called as a function: `opt.variables()` on Keras 3."""
CALLS_VARIABLES = re.compile(r"\.variables\(\s*\)")
FRAME = re.compile(r'^\s*File "([^"]*)", line \d+')
"""A traceback's frame line (`  File "/workdir/train.py", line 40, in <module>`), its source lines below it."""
TRACEBACK = "Traceback (most recent call last):"
KERAS2_PATH = "/tf_keras/"
"""In a frame's file: Keras 2's own code, so Keras 2 is what runs."""
TAIL_LINES = 60
"""Each rank's last lines the job agent keeps (Watch): a traceback of Horovod's examples takes about 20."""

FIXES = {
    "launcher": f"launcher start --env {SETTING} ...",
    "mpijob": f"launcher export mpijob --env {SETTING} ...",
    "smoke": f"docker run -e {SETTING} ... smoke ...",
}
"""How each launch method gives every rank the setting (compose's: fix)."""


def fix(launch_method: str, command: Sequence[str] = ()) -> str:
    """How `launch_method`'s users give every rank SETTING; compose's, which hands its ranks no variable of the
    user's, puts it in front of the job's command (TRAIN_COMMAND)."""
    if launch_method == "compose":
        return f'TRAIN_COMMAND="env {SETTING} {shlex.join(command) if command else "python ..."}" in .env'
    return FIXES[launch_method]


def explained(error: str | None, launch_method: str, command: Sequence[str] = ()) -> str:
    """A rank's error, when it is Keras 2 code on Keras 3: the problem and the fix first, Python's line after."""
    told = (
        f"Keras 2 code on Keras 3, {TENSORFLOW.image}'s default (a Keras 3 optimizer's `variables` is a list, not a "
        f"method): run it with {SETTING} for Keras 2, {fix(launch_method, command)}"
    )
    return f"{told} ({error})" if error else told


def keras2_asked(words: Iterable[str]) -> bool:
    """Whether KEY=VALUE words (the ranks' environment, the job's command line) set VARIABLE to turn Keras 2 on."""
    return any(name == VARIABLE and value in KERAS2_VALUES for name, _, value in (w.partition("=") for w in words))


def keras2_on_keras3(lines: Sequence[str], words: Iterable[str] = ()) -> bool:
    """Whether one rank's lines (its own text, tags off) show it died of Keras 2 code on Keras 3 (the module's rule);
    `words`: the ranks' KEY=VALUE words, where Keras 2 may have been asked for already."""
    texts = [line.rstrip("\r\n") for line in lines]
    raised = next((index for index in reversed(range(len(texts))) if texts[index].strip() == ERROR), None)
    if raised is None or keras2_asked(words):
        return False
    frame = next((index for index in reversed(range(raised)) if FRAME.match(texts[index])), None)
    if frame is None or not any(CALLS_VARIABLES.search(text) for text in texts[frame + 1 : raised]):
        return False
    start = next((index for index in reversed(range(frame)) if texts[index].strip() == TRACEBACK), 0)
    paths = (found[1] for text in texts[start:raised] if (found := FRAME.match(text)))
    return not any(KERAS2_PATH in path for path in paths)


class Watch:
    """Reads a job's output a line at a time, each tagged with its rank (mpirun's --tag-output, elastic horovodrun's
    tag), and keeps the first rank whose output shows Keras 2 code on Keras 3 (keras2_on_keras3). `words`: the job's
    command line, whose KEY=VALUE words (mpirun's -x pairs, an `env` in front of the command) are its ranks'."""

    def __init__(self, words: Iterable[str] = ()) -> None:
        self.asked = keras2_asked(words)
        self.rank: int | None = None
        """The first rank seen to die of it; None: none (yet)."""
        self._tails: dict[int, deque[str]] = {}

    def feed(self, line: str) -> None:
        tagged = split_tag(line.rstrip("\r\n"))
        if tagged is None or self.asked or self.rank is not None:
            return
        rank, _, text = tagged
        tail = self._tails.setdefault(rank, deque(maxlen=TAIL_LINES))
        tail.append(text)
        if text.strip() == ERROR and keras2_on_keras3(tail):
            self.rank = rank
