"""The Kubernetes door: the MPIJob document `launcher export mpijob` writes (mpijob.py) and its launcher pod's side
(launcher_pod.py), which runs the job agent against the MPI Operator's hostfile and keys.
"""
