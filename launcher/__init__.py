"""`launcher`: runs a Horovod job across Docker hosts, and the job agent that every door's job runs under.

One launch, in order: settings (.env, flags: settings.py, a LaunchSettings holding one core/options.JobOptions)
-> the node checks (preflight.py, fed by each node's engine: engine.py) -> a plan and its job spec (plan.py,
core/job.py; pure) -> a worker container on every node, the cluster's SSH trust handed over (session.py,
core/sshtrust.py) -> the job agent in the rank-0 container (agent/job.py): readiness, a lifeline to every worker,
mpirun, the exit status and root cause, every worker stopped.

The sides, by folder:
- launcher/*.py, the user's machine: cli (parses and prints), settings, plan, preflight, engine, session, doctor,
  clusters (status, logs, stacks, results, stop), images, results, links and linkcheck (doctor --links), workdir,
  jobstate;
- launcher/core/, what both sides read: options, job, nics, protocol, stall, sshtrust;
- launcher/agent/, what runs in the containers: the agent and its transport, compose's door, stacks, rank_nic,
  linkprobe;
- launcher/k8s/, the Kubernetes door: the MPIJob document and its launcher pod.
Imports run one way: core <- agent <- k8s <- the host side (cli's export), and core <- the host side.
"""
