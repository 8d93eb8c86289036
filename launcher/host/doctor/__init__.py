"""`launcher doctor`: a start's checks on every node printed in full, Open MPI's ports, and with --links every pair
of nodes' link measured. Reads every other package of launcher/host/ (a start's checks are running/nodechecks.py)."""
