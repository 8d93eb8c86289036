"""`launcher`: runs a Horovod job across Docker hosts, and the job agent that every launch method's job runs under.

One launch, in order: settings (.env, flags: host/flags.py, host/settings.py, a LaunchSettings holding one
core/options.JobOptions) -> the node checks (host/nodechecks.py, host/preflight.py, fed by each node's engine:
host/engines.py) -> a plan and its job spec (host/plan.py, core/job.py; pure) -> a worker container on every node, the
cluster's SSH trust handed over (host/handover.py, core/sshtrust.py) -> the job agent in the rank-0 container
(agent/job.py): readiness, an ssh connection to every worker, mpirun, the exit status and root cause, every worker
stopped.

The packages, by folder:
- cli.py, the face on top: declares the commands and flags, calls the host side, prints; no logic of its own;
- launcher/host/, the user's machine: flags, settings, access and reach (the engines' addresses), engines (and
  their Docker SDK driver: docker_driver, docker_sdk), preflight, plan, images, workdir, launch (and its steps:
  nodechecks, handover, follow, rootcause) and its signal policy (signals), clusters (status, logs, stacks,
  results, stop), ranklogs (a job's output by rank and node), jobstate, results, streams, doctor, links and
  linkcheck (doctor --links), trainer (the bundled trainer's options, checked before any node is contacted);
- launcher/core/, what every side reads: options, job, nics (which NIC is mine here), ranks (ranks per node, and
  which ranks a node runs), protocol, pod_contract (an MPIJob launcher pod's arguments), stall, sshtrust, imageref,
  restart (a lost node's restart), metrics (the trainer's metrics file, read), ranktag (the rank tag on a job's
  output lines), legacy_keras (a rank that died of Keras 2 code on Keras 3, and the fix);
- launcher/agent/, what runs in the containers: the agent (job, and its parts: workers, restarts, watches, records)
  and its transport, compose's job (compose), the MPIJob launcher pod's job (mpijob_pod), stacks, rank_nic, linkprobe;
- launcher/k8s/, the Kubernetes document: the MPIJob, its checked request (mpijob_request), its pods'
  resources and Pod Security checks;
- launcher/smoke/, the image's `smoke` role: a script on N ranks in one container, for a CI runner.
Imports run one way: core <- agent <- smoke, core <- k8s, core <- host, and cli on top of host and k8s (export):
the agent and smoke never import the host side, k8s reads only core, nothing imports cli, app/ never imports
launcher, and no module imports itself by way of others (tests/test_import_rules.py holds these).
"""
