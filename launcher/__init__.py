"""`launcher`: runs a Horovod job across Docker hosts, and the job agent that every launch method's job runs under.

One launch, in order: settings (.env, flags: host/planning/flags.py and settings.py, a LaunchSettings holding one
core/options.JobOptions) -> the node checks (host/running/nodechecks.py, host/planning/preflight.py, fed by each
node's engine: host/engines/node_engine.py) -> a plan and its job spec (host/planning/plan.py, core/jobspec.py; pure) ->
a worker container on every node, the cluster's SSH trust handed over (host/running/handover.py, core/sshtrust.py) ->
the job agent in the rank-0 container (agent/job.py): readiness, an ssh connection to every worker, mpirun, the exit
status and root cause, every worker stopped.

The packages, by folder:
- cli.py, the face on top: declares the commands and flags, calls the host side, prints; no logic of its own;
- launcher/host/, the user's machine, in four packages: planning (flags, settings, access: the engines' addresses,
  workdir, trainer: the bundled trainer's options, plan, preflight), engines (node_engine: the NodeEngine protocol,
  its Docker SDK driver: docker_driver, docker_sdk; reach, images, streams), running (launch and its steps:
  nodechecks, handover, follow, rootcause; its signal policy, signals; clusters: status, logs, stacks, results, stop;
  jobstate, ranklogs, results) and doctor (checkup, portcheck, link_report and link_probes: doctor --links);
- launcher/core/, what every side reads: options, jobspec, nics (which NIC is mine here), ranks (ranks per node, and
  which ranks a node runs), protocol, pod_contract (an MPIJob launcher pod's arguments), stall, sshtrust, imageref,
  restart (a lost node's restart), metrics (the trainer's metrics file, read), ranktag (the rank tag on a job's
  output lines), legacy_keras (a rank that died of Keras 2 code on Keras 3, and the fix);
- launcher/agent/, what runs in the containers: the agent (job, and its parts: workers, restarter, watches, records)
  and its transport, compose's job (compose), the MPIJob launcher pod's job (mpijob_pod), stacks, a Slurm batch
  script's stall watch (batch_stall), rank_nic, linkprobe;
- launcher/k8s/, the Kubernetes document: the MPIJob, its checked request (mpijob_request), its pods'
  resources and Pod Security checks;
- launcher/slurm/, the Slurm batch script: its checked request (sbatch_request) and the script (sbatch), every rank a
  Slurm task in the image's SIF;
- launcher/smoke/, the image's `smoke` role: a script on N ranks in one container, for a CI runner.
Imports run one way: core <- agent <- smoke, core <- k8s, core <- slurm, core <- host, and cli on top of host, k8s
and slurm (export); inside host, planning <- engines <- running <- doctor: the agent and smoke never import the host
side, k8s and slurm read only core (and app's rank-side rules), nothing imports cli, app/ never imports launcher, and
no module imports itself by way of others (tests/test_import_rules.py holds these).
"""
