"""The code every side reads: a job's options, the job spec and its command lines, the NIC rules, the ranks per node,
the protocol the stack's processes share, the pod contract of an MPIJob's launcher pod, the stall record, Keras 2
code on Keras 3 told from a rank's traceback (legacy_keras) and the cluster's SSH trust. It imports nothing from the
host side (launcher/host/, launcher/cli.py), the agent (launcher/agent/), the Kubernetes export (launcher/k8s/) or the
smoke role (launcher/smoke/).
"""
