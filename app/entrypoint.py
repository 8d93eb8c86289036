"""How a rank runs the bundled trainer: the one command every launch method puts in front of the trainer's options.

Stdlib-only and import-free, so the launcher (which installs without torch) and the benches both read it here.
"""

TRAINER = ("python", "-m", "app.train")
