"""`python -m launcher`: the `launcher` command, for where pip put its script off PATH (a user install, a venv not
activated)."""

from launcher.cli import main

main()
