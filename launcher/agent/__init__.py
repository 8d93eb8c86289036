"""What runs inside the stack's containers: the job agent (job.py: readiness, the run, the end), its contact with the
workers (workers.py), its restarts (restarter.py), the watches beside the running job (watches.py), Horovod's records
summarised at the end (records.py) and its ssh side effects (transport.py), compose's job (compose.py), an MPIJob
launcher pod's job (mpijob_pod.py), the ranks' stacks (stacks.py), each rank's NIC in a subnet (rank_nic.py) and the
link probe of `launcher doctor --links` (linkprobe.py). `python -m launcher.agent` runs its commands (__main__.py). It
reads launcher/core/ and never the host side (launcher/host/, launcher/cli.py).
"""
