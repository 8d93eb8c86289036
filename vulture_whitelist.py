"""What vulture (the dead-code check in the lint step; [tool.vulture] in pyproject.toml) cannot see used: names that a
library, the interpreter or a test runner calls or reads by name. Never imported or run; one entry a line, each with
who uses it. A name listed here counts as used everywhere, so keep each entry to a name that is truly used.
"""

# ruff: noqa
# mypy: ignore-errors

_.print_help  # app/config.py: argparse calls it for --help (the checking parser prints nothing)
_.install  # app/frameworks.py, app/rank_error.py: the images' horovod_stack_hint.pth runs them at start-up
_.horovod_stack_one_line  # app/frameworks.py sets it on an exception; app/rank_error.py reads it by name (ONE_LINE)
_.__signature__  # launcher/cli.py with_flags: typer reads the command's parameters from it
_.__annotations__  # launcher/cli.py with_flags: inspect reads it next to __signature__
_.readable  # launcher/host/engines/streams.py ChunkReader: io.BufferedReader asks it (io.RawIOBase's protocol)
_.readinto  # launcher/host/engines/streams.py ChunkReader: io.BufferedReader calls it (io.RawIOBase's protocol)
_.RANKS_PER_NODE_MAX  # launcher/core/mpiports.py: the port range's capacity, only tests/test_mpiports.py reads it
_.gid  # launcher/core/sshtrust.py, launcher/host/planning/workdir.py: tarfile writes the member's group from it
_.gname  # launcher/host/planning/workdir.py: tarfile writes the member's group name from it
_.linkname  # tests/test_results.py: tarfile writes a symbolic link's target from it
_._split_scope  # tests/conftest.py TwoRooms: pytest-xdist's LoadScopeScheduling calls it
_.handle_hosts_updated  # tests/test_rendezvous_guard.py Manager: Horovod's WorkerNotificationService calls it
_.register_worker_server  # tests/test_rendezvous_guard.py Driver: Horovod's elastic rendezvous handler calls it
_.identity_file  # tests/test_horovod_patch.py session_like_sshd: Horovod's get_remote_command's, by keyword
_.timeout_s  # tests/test_horovod_patch.py session_like_sshd: Horovod's get_remote_command's, by keyword
_.pod_network  # tests/test_mpijob_conformance.py: a fixture the operator fixture asks for to set it up first
