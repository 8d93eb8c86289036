"""What to run and where, decided on the user's machine before any container starts: the flags, the settings, how
each node's engine is addressed, the plan and the checks' findings. Reads no other package of launcher/host/."""
