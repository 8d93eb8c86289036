"""The user's machine: everything `launcher` does before and around a job, the job itself being the agent's
(launcher/agent/); launcher/cli.py, on top, only parses flags and prints what these return.

    flags.py      what each flag means: its help text, and what start's and export's flags turn into
    settings.py   .env, the environment and the flags as LaunchSettings (one core/options.JobOptions inside)
    access.py     how each node's engine is reached (ssh://, TLS, DOCKER_HOST_<NODE>), and who could read it
    reach.py      whether a node's engine answers at all, in bounded time, before the Docker SDK connects
    engines.py    one node's Docker engine as the host side sees it: the NodeEngine protocol, its records, NodeError;
                  docker_driver.py, its Docker SDK implementation (NodeDriver); docker_sdk.py, docker-py's faults
                  corrected and its exceptions as NodeErrors
    preflight.py  the node checks start, --dry-run and doctor share (pure)
    plan.py       the settings plus what the checks found, as worker containers and the job spec (pure)
    images.py     the same image on every node (pulled, or pushed from this machine)
    workdir.py    what of --workdir travels, and its archive
    launch.py     one launch in order: connect, check, start the workers, hand over trust, follow, clean up
    nodechecks.py the checks a start makes on the nodes (facts, preflight's findings, the image everywhere)
    handover.py   the code folder and the cluster's SSH trust, handed to the worker containers
    follow.py     an attached job followed (its output, the agent's lines) and an elastic job's workers watched
    rootcause.py  LaunchError, and a failed job's one root cause from what the engines saw
    signals.py    which signals end an attached launch or a link test, how each is worded, its exit status
    clusters.py   the clusters already started: status, logs, stacks, results, stop
    ranklogs.py   a job's output by rank and node: logs --rank/--node/--grep/--tee, start --ranks (pure)
    jobstate.py   a cluster's job state from what its containers hold (pure)
    results.py    a run folder copied home
    streams.py    byte streams from the engines, read as they arrive, and decoded for a terminal
    doctor.py     `launcher doctor`: every check printed, the clock skew, the verdict
    links.py      `doctor --links`, its pure part; linkcheck.py, its containers
    trainer.py    the bundled trainer's options, checked before any node is contacted
"""
