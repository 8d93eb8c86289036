"""The user's machine: everything `launcher` does before and around a job, the job itself being the agent's
(launcher/agent/); launcher/cli.py, on top, only parses flags and prints what these return. Four packages, each
reading only those above it here (tests/test_import_rules.py holds the order):

    planning/   what to run and where, decided before any container starts (pure but for reading .env)
        flags.py      what each flag means: its help text, and what start's and export's flags turn into
        settings.py   .env, the environment and the flags as LaunchSettings (one core/options.JobOptions inside)
        access.py     how each node's engine is addressed (ssh://, TLS, DOCKER_HOST_<NODE>), and who could read it
        workdir.py    what of --workdir travels, and its archive
        trainer.py    the bundled trainer's options, checked before any node is contacted
        plan.py       the settings plus what the checks found, as worker containers and the job spec
        preflight.py  the node checks start, --dry-run and doctor share: facts in, findings out
    engines/    each node's Docker engine and what travels through it
        node_engine.py    the NodeEngine protocol, its records (Container, ContainerState, Loss) and NodeError
        docker_driver.py  its Docker SDK implementation (NodeDriver); docker_sdk.py, docker-py's faults corrected and
                          its exceptions as NodeErrors
        reach.py      whether a node's engine answers at all, in bounded time, before the Docker SDK connects
        images.py     the same image on every node (pulled, or pushed from this machine)
        streams.py    byte streams from the engines, read as they arrive, and decoded for a terminal
    running/    a job started, followed and looked at afterwards
        launch.py     one launch in order: connect, check, start the workers, hand over trust, follow, clean up
        nodechecks.py the checks a start makes on the nodes (facts, preflight's findings, the image everywhere)
        handover.py   the code folder and the cluster's SSH trust, handed to the worker containers
        follow.py     an attached job followed (its output, the agent's lines) and an elastic job's workers watched
        rootcause.py  LaunchError, and a failed job's one root cause from what the engines saw
        signals.py    which signals end an attached launch or a link test, how each is worded, its exit status
        clusters.py   the clusters already started: status, logs, stacks, results, stop
        jobstate.py   a cluster's job state from what its containers hold (pure)
        ranklogs.py   a job's output by rank and node: logs --rank/--node/--grep/--tee, start --ranks (pure)
        results.py    a run folder copied home
    doctor/     `launcher doctor`
        checkup.py      every check printed, the clock skew, the verdict
        portcheck.py    whether an address outside a node's subnet reaches Open MPI's ports there
        link_report.py  `doctor --links`, its pure part: the pairs, a probe's reading, the matrix, the prediction
        link_probes.py  `doctor --links`, its containers: one pair of nodes probed at a time
"""
