"""The code both sides read: a job's options, the job spec and its command lines, the NIC rules, the protocol the
stack's processes share, the stall record and the cluster's SSH trust. It imports nothing from the host side
(launcher/*.py), the agent (launcher/agent/) or the Kubernetes door (launcher/k8s/).
"""
