"""The bundled trainer's options, checked where a job is made rather than where it runs: with the trainer's own parser
(app/config.py, which needs no torch), less what depends on the machine that runs it (its folders, its packages).

A launcher command passes every word it does not know on to the job, so a mistyped launcher option (`--gpu 2` for
`--gpus 2`) would otherwise reach the trainer, on every node, after the image was pushed and the workers started.
A command of the user's own is theirs: it is not checked.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

from app.config import ConfigError, check_options, option_names
from app.entrypoint import TRAINER
from launcher.core.options import SettingsError, job_command

CLOSE = 0.6
"""How alike an unknown option and a real one must be for the real one to be offered (difflib's ratio)."""


def checked_command(words: Sequence[str], launcher_options: Iterable[str]) -> tuple[str, ...]:
    """The job's command from the words a launcher command did not take (job_command), the bundled trainer's options
    checked (trainer_problem); raises SettingsError with the one line where it would refuse them."""
    command = job_command(list(words))
    problem = trainer_problem(command, launcher_options)
    if problem:
        raise SettingsError(problem)
    return command


def trainer_problem(command: Sequence[str], launcher_options: Iterable[str] = ()) -> str | None:
    """Why the bundled trainer would refuse `command`'s options, in one line naming the option and the fix; None if
    it would take them, or if `command` is the user's own. `launcher_options`: the options of the launcher command
    the words came through (`launcher start`'s), so that a mistyped one is named."""
    if tuple(command[: len(TRAINER)]) != TRAINER:
        return None
    try:
        unknown = check_options(command[len(TRAINER) :])
    except ConfigError as error:
        return f"the bundled trainer's options: {error}"
    if not unknown:
        return None
    word = next((word for word in unknown if word.startswith("-")), None)
    if word is None:
        return (
            f"the bundled trainer takes options only, not {unknown[0]!r}: a command of your own comes first after "
            "`--` (-- python train.py ...)"
        )
    name = word.split("=", 1)[0]
    ours = [option for option in launcher_options if option.startswith("-")]
    if name in ours:  # the launcher would have taken it before a `--`
        return f"{name} is an option of the launcher, not of the bundled trainer: put it before the `--`"
    subject = (
        f"{name} is neither a launcher option nor one of the bundled trainer's"
        if ours
        else f"the bundled trainer has no option {name}"
    )
    launcher_match, trainer_match = nearest(name, ours), nearest(name, option_names())
    if launcher_match and (not trainer_match or launcher_match[0] >= trainer_match[0]):
        return f"{subject}; did you mean the launcher's {launcher_match[1]} (before any `--`)?"
    if trainer_match:
        return f"{subject}; did you mean the trainer's {trainer_match[1]}?"
    return f"{subject}: check its spelling, or drop it"


def nearest(word: str, options: Iterable[str]) -> tuple[tuple[bool, float], str] | None:
    """The option `word` most likely stands for, with how close it is: one it begins (an option cut short, `--gpu`
    for `--gpus-per-node`) before one merely alike (difflib's ratio of at least CLOSE); None if none is."""
    scored = [
        ((option.startswith(word) and len(word) > 2, difflib.SequenceMatcher(None, word, option).ratio()), option)
        for option in options
        if option != word
    ]
    close = [item for item in scored if item[0][0] or item[0][1] >= CLOSE]
    return max(close, default=None)
