"""The Kubernetes document: the MPIJob `launcher export mpijob` writes (mpijob.py) from its checked request
(mpijob_request.py), its pods' CPU and memory (resources.py) and their Pod Security checks (podsecurity.py). Pure,
and it reads only launcher/core/: what the launcher pod runs is the agent's (launcher/agent/mpijob_pod.py), its
arguments the pod contract (launcher/core/pod_contract.py).
"""
