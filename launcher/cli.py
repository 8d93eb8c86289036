"""The `launcher` command line: parses flags and .env into settings, calls one function, prints. No logic of its own:
the checks are launcher/host/preflight.py's, a launch launcher/host/launch.py's, the doctor launcher/host/doctor.py's, the
clusters already started launcher/host/clusters.py's, the MPIJob document launcher/k8s/mpijob.py's.
"""

from __future__ import annotations

import codecs
import signal
import sys
import time
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn

import typer

from launcher.core.nics import NIC_SETTING
from launcher.core.options import SettingsError, job_command
from launcher.core.protocol import LINK_SECONDS, STOP_SIGNALS, Signalled
from launcher.host import access, clusters, doctor, launch
from launcher.host.engines import NodeEngine, NodeError
from launcher.host.settings import LaunchSettings, load_env_file, resolve_settings
from launcher.host.trainer import trainer_problem

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Run Horovod training across Docker hosts: one worker container per node, mpirun from rank 0.",
)

NODES_HELP = "Comma-separated hosts, rank 0 first, each HOST or HOST:RANKS as horovodrun's -H (default: NODES in .env)."
HOSTFILE_HELP = "Open MPI hostfile listing the nodes instead of --nodes: one `HOST slots=N` line each, rank 0 first."
NIC_HELP = (
    "The nodes' NIC for Open MPI, NCCL and Gloo: a name every node has (eth0), or a subnet (10.0.0.0/24) where "
    f"the names differ: each node uses its NIC in it (default: {NIC_SETTING} in .env; none: virtual NICs left out)."
)
ENV_FILE_HELP = "Settings file (default: ./.env if present)."
GPUS_HELP = (
    "GPUs per node, one rank each (NVIDIA Container Toolkit): a count, or GPU IDs such as 0,1 (device=1 for one "
    "GPU by ID); default: GPUS_PER_NODE in .env."
)
INSECURE_HELP = (
    "Allow engines off this machine that others could read: plain tcp://, or TLS without DOCKER_TLS_VERIFY (or "
    "INSECURE_ENGINES=1 in .env); the cluster's private key, job settings, registry credentials and the workdir "
    "then cross the network unencrypted, with a warning. Without it such an engine is refused; use TLS "
    "(DOCKER_TLS_VERIFY, DOCKER_CERT_PATH; per node DOCKER_TLS_VERIFY_<NODE>, DOCKER_CERT_PATH_<NODE>)."
)
STOPPED_BY = {
    signal.SIGINT: "interrupted",
    signal.SIGTERM: "stopped (SIGTERM)",
    signal.SIGHUP: "the terminal closed (SIGHUP)",
}


def echo_to_stderr(line: str) -> None:
    try:
        typer.echo(line, err=True)
    except OSError:  # a closed terminal (SIGHUP) must not stop the cleanup that follows
        pass


def say(message: str) -> None:
    for line in message.splitlines():
        echo_to_stderr(f"[launcher {time.strftime('%H:%M:%S')}] {line}")


def fail(message: str, code: int = 1) -> NoReturn:
    for line in message.splitlines() or [""]:
        echo_to_stderr(f"error: {line}")
    raise typer.Exit(code)


def write_out(chunks: Iterable[bytes]) -> None:
    # Incremental: a character split between two chunks is still one character.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in chunks:
        sys.stdout.write(decoder.decode(chunk))
        sys.stdout.flush()
    sys.stdout.write(decoder.decode(b"", final=True))


def stop_on_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP end an attached launch the same way: the cluster is removed on every node, once
    (further signals are ignored while that runs). A signal the launcher was started ignoring (nohup, a background
    job's SIGINT) stays ignored: that is the caller's choice."""

    def stop(signum: int, _frame: object) -> None:
        for other in STOP_SIGNALS:
            signal.signal(other, signal.SIG_IGN)
        raise Signalled(signum)

    for signum in STOP_SIGNALS:
        if signum == signal.SIGTERM or signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, stop)


def settings_from(
    nodes: str | None, env_file: Path | None, hostfile: Path | None, insecure_engine: bool, **flags: Any
) -> LaunchSettings:
    """The settings from .env, the environment and the flags (exit 2 on a bad one); says once which engines others
    could read, where --insecure-engine allowed them."""
    try:
        settings = resolve_settings(
            load_env_file(env_file), nodes=nodes, hostfile=hostfile, insecure_engines=insecure_engine, **flags
        )
        warning = access.warning(settings.exposed_engines())
    except SettingsError as error:
        fail(str(error), 2)
    if warning:
        echo_to_stderr(warning)
    return settings


def checked_command(ctx: typer.Context) -> tuple[str, ...]:
    """The job's command from the words the launcher command did not take (job_command). The bundled trainer's
    options are checked here, with its own parser: a mistyped launcher option ends here with one line and exit 2,
    before any node is contacted or any document written. A command of the user's own is left as it is."""
    command = job_command(ctx.args)
    ours = [name for param in ctx.command.get_params(ctx) for name in (*param.opts, *param.secondary_opts)]
    problem = trainer_problem(command, ours)
    if problem:
        fail(problem, 2)
    return command


def engines_of(settings: LaunchSettings) -> list[NodeEngine]:
    try:
        return launch.connect_all(settings, lambda _: None)
    except launch.LaunchError as error:
        fail(str(error))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def start(
    ctx: typer.Context,
    nodes: str | None = typer.Option(None, help=NODES_HELP),
    hostfile: Path | None = typer.Option(None, help=HOSTFILE_HELP),
    slots: int | None = typer.Option(None, help="Ranks per node on CPUs (default 1)."),
    gpus: str | None = typer.Option(None, "--gpus", "--gpus-per-node", help=GPUS_HELP),
    image: str | None = typer.Option(None, help="Image to run (default horovod-stack:latest)."),
    ssh_port: int | None = typer.Option(None, help="Port of the workers' sshd (default 12345)."),
    network_interface: str | None = typer.Option(None, help=NIC_HELP),
    env_file: Path | None = typer.Option(None, help=ENV_FILE_HELP),
    insecure_engine: bool = typer.Option(False, "--insecure-engine", help=INSECURE_HELP),
    push_image: bool = typer.Option(False, help="Copy the image from this machine's engine to nodes that lack it."),
    detach: bool = typer.Option(
        False,
        help="Return once training runs; follow with `launcher logs --follow`; "
        "every container stops when the job ends.",
    ),
    keep_running: bool = typer.Option(
        False,
        help="With --detach: keep the containers running after the job "
        "ends, for debugging (`launcher stop` removes them).",
    ),
    workdir: Path | None = typer.Option(
        None, help="Local folder with your code, copied to /workdir on every node; the command runs there."
    ),
    env: list[str] | None = typer.Option(None, "--env", help="KEY=VALUE for every rank (repeatable)."),
    secret: list[str] | None = typer.Option(
        None,
        "--secret",
        help="NAME of a secret setting (an API key, a token) every rank gets, its value taken from this machine's "
        "environment or .env and never shown: not on a command line, in a log or in the plan (repeatable; "
        "default: SECRETS in .env).",
    ),
    elastic: bool = typer.Option(
        False,
        help="Elastic training (horovodrun, Gloo): a node whose worker is lost is "
        "dropped and the job goes on; needs --network-interface.",
    ),
    min_nodes: int | None = typer.Option(
        None, help="With --elastic: the fewest nodes the job goes on with (default 1)."
    ),
    max_nodes: int | None = typer.Option(
        None, help="With --elastic: the most nodes that train at once (default: all)."
    ),
    restart_workers: bool = typer.Option(
        False,
        help="With --elastic: start a lost node's worker again; it "
        "rejoins at the next host discovery (not with --detach).",
    ),
    device: list[str] | None = typer.Option(
        None,
        "--device",
        help="A host device for every worker, HOST[:CONTAINER] (repeatable; default: DEVICES in .env), e.g. "
        "/dev/infiniband so NCCL uses RDMA instead of sockets.",
    ),
    debug: bool = typer.Option(
        False, help="NCCL_DEBUG=INFO for every rank: NCCL's topology and transports (default: WARN, errors only)."
    ),
    mount: list[str] | None = typer.Option(
        None,
        "--mount",
        help="A host folder for every worker, HOST_PATH:CONTAINER_PATH[:ro] (repeatable; default: MOUNTS in .env), "
        "e.g. a dataset at the same path on every node: /data/mnist:/data:ro.",
    ),
    stall_timeout: int | None = typer.Option(
        None,
        help="Seconds without output or new metrics before the job counts as stalled: every rank's stack goes into "
        "its log and `launcher status` says so (default: STALL_TIMEOUT in .env, else 300; 0: off).",
    ),
    stall_action: str | None = typer.Option(
        None, help="On a stall: warn (the job goes on) or fail (it ends with the stall as its error); default warn."
    ),
    time_limit: int | None = typer.Option(
        None,
        help="Seconds the job may run: past them every rank's stack goes into its log and the job is ended, exit "
        "status 124, with the limit as its error (default: TIME_LIMIT in .env, else 0: no limit).",
    ),
    no_ptrace: bool = typer.Option(
        False,
        "--no-ptrace",
        help="Start the workers without SYS_PTRACE, for clusters that forbid it: no stacks (`launcher stacks`, a "
        "stall, the time limit) (default: PTRACE in .env, else with it).",
    ),
    timeline: bool = typer.Option(
        False,
        help="Rank 0 writes Horovod's timeline into the run folder (timeline.json; `launcher results` brings it home; "
        "open it in https://ui.perfetto.dev or chrome://tracing). Default: TIMELINE in .env.",
    ),
    autotune: bool = typer.Option(
        False,
        help="Horovod's autotuning of the fusion threshold, cycle time and more while the job trains; its log and "
        "what it chose go into the run folder (autotune.csv, autotune.json). Default: AUTOTUNE in .env.",
    ),
    dry_run: bool = typer.Option(
        False,
        help="Run every check a start runs and print the plan (containers, hostfile, mpirun line); start nothing.",
    ),
) -> None:
    """Start a worker on every node and run a job; rank 0's output streams here and the exit status is the job's.

    Your own script: launcher start --nodes node_1,node_2 --workdir ./code -- python train.py --epochs 5
    (after --, a command every rank runs, as with mpirun). The bundled trainer: launcher start --nodes
    node_1,node_2 --slots 2 -- --dataset digits --epochs 5 (options alone go to python -m app.train).
    Elastic: launcher start --nodes node_1,node_2,node_3 --elastic --min-nodes 2 --network-interface eth0
    (the elastic driver runs on rank 0's node: losing that node ends the job).

    The job runs in the cluster (a job agent in rank 0's container), not in this process: Ctrl-C, SIGTERM or a
    closed terminal remove the cluster on every node (exit 130, 143, 129); if this process dies outright, the job
    goes on, every container stops when it ends, and `launcher status` says how it ended.
    """
    command = checked_command(ctx)
    settings = settings_from(
        nodes,
        env_file,
        hostfile,
        insecure_engine,
        slots=slots,
        gpus=gpus,
        image=image,
        devices=tuple(device or ()),
        push_image=push_image,
        detach=detach,
        keep_running=keep_running,
        job={
            "command": command,
            "env": (*(env or ()), *(["NCCL_DEBUG=INFO"] if debug else [])),
            "secrets": tuple(secret or ()),
            "network_interface": network_interface,
            "ssh_port": ssh_port,
            "stall_timeout": stall_timeout,
            "stall_action": stall_action,
            "time_limit": time_limit,
            "elastic": elastic,
            "elastic_min_workers": min_nodes,
            "elastic_max_workers": max_nodes,
            "restart_workers": restart_workers,
            "workdir": str(workdir) if workdir else None,
            "mounts": tuple(mount or ()),
            "ptrace": False if no_ptrace else None,
            "timeline": timeline or None,
            "autotune": autotune or None,
        },
    )
    if dry_run:
        try:
            launch.dry_run(settings, say=say)
        except (launch.LaunchError, NodeError) as error:
            fail(str(error))
        raise typer.Exit(0)
    stop_on_signals()
    try:
        status = launch.launch(settings, say=say, relay=echo_to_stderr)
    except (launch.LaunchError, NodeError) as error:
        fail(str(error))
    except Signalled as stop:
        fail(f"{STOPPED_BY[signal.Signals(stop.signum)]}; the cluster's containers were removed", 128 + stop.signum)
    except Exception as error:  # anything unforeseen still ends as one line; cleanup already ran
        fail(
            f"unexpected {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}; "
            "the cluster's containers were removed"
        )
    raise typer.Exit(status)


@app.command()
def stop(
    nodes: str | None = typer.Option(None, help=NODES_HELP),
    hostfile: Path | None = typer.Option(None, help=HOSTFILE_HELP),
    cluster: str | None = typer.Option(None, help="Cluster ID (default: every cluster of this stack)."),
    env_file: Path | None = typer.Option(None, help=ENV_FILE_HELP),
    insecure_engine: bool = typer.Option(False, "--insecure-engine", help=INSECURE_HELP),
) -> None:
    """Remove the stack's containers on the nodes, running or ended.

    Example: launcher stop --nodes node_1,node_2 --cluster 3f9a1c2e
    """
    for line in clusters.stop(engines_of(settings_from(nodes, env_file, hostfile, insecure_engine)), cluster):
        typer.echo(line)


@app.command()
def status(
    nodes: str | None = typer.Option(None, help=NODES_HELP),
    hostfile: Path | None = typer.Option(None, help=HOSTFILE_HELP),
    env_file: Path | None = typer.Option(None, help=ENV_FILE_HELP),
    insecure_engine: bool = typer.Option(False, "--insecure-engine", help=INSECURE_HELP),
) -> None:
    """Each cluster's job (running: epoch, accuracy, throughput; succeeded; failed, with its cause) and containers.

    Example: launcher status --nodes node_1,node_2
    """
    for line in clusters.status(engines_of(settings_from(nodes, env_file, hostfile, insecure_engine))):
        typer.echo(line)


@app.command()
def results(
    nodes: str | None = typer.Option(None, help=NODES_HELP),
    hostfile: Path | None = typer.Option(None, help=HOSTFILE_HELP),
    cluster: str | None = typer.Option(None, help="Whose run (its cluster ID; default: the newest run)."),
    to: Path = typer.Option(Path("results"), help="Folder to copy the run folder into (made if missing)."),
    checkpoints: bool = typer.Option(True, help="Copy checkpoints/ too (--no-checkpoints leaves them there)."),
    env_file: Path | None = typer.Option(None, help=ENV_FILE_HELP),
    insecure_engine: bool = typer.Option(False, "--insecure-engine", help=INSECURE_HELP),
) -> None:
    """Copy a run's folder (metrics.jsonl, summary.json, curves.png, tb/, checkpoints/) from its node to this
    machine, through the Docker API; the cluster may be running, ended or removed.

    Example: launcher results --nodes node_1,node_2 --to ./results
    """
    settings = settings_from(nodes, env_file, hostfile, insecure_engine)
    try:
        run, written = clusters.fetch_results(
            engines_of(settings), settings.image, settings.shared_dir, cluster, to, checkpoints
        )
    except clusters.ClusterError as error:
        fail(str(error))
    say(f"run {run.name} from {run.node}: {len(written)} file(s) in {to / run.name}")
    for name in written:
        typer.echo(str(to / name))


@app.command()
def stacks(
    nodes: str | None = typer.Option(None, help=NODES_HELP),
    hostfile: Path | None = typer.Option(None, help=HOSTFILE_HELP),
    cluster: str | None = typer.Option(None, help="Cluster ID (default: the running one)."),
    native: bool = typer.Option(False, help="Native (C/C++) frames too, e.g. inside Horovod's or NCCL's code."),
    env_file: Path | None = typer.Option(None, help=ENV_FILE_HELP),
    insecure_engine: bool = typer.Option(False, "--insecure-engine", help=INSECURE_HELP),
) -> None:
    """Every rank's Python stack now, on every node (py-spy), identical stacks printed once: where a hung job hangs.

    Example: launcher stacks --nodes node_1,node_2
    """
    try:
        stream, engine, exec_id = clusters.stacks(
            engines_of(settings_from(nodes, env_file, hostfile, insecure_engine)), cluster, native
        )
    except clusters.ClusterError as error:
        fail(str(error))
    write_out(stream)
    raise typer.Exit(engine.exec_exit_code(exec_id) or 0)


@app.command()
def logs(
    nodes: str | None = typer.Option(None, help=NODES_HELP),
    hostfile: Path | None = typer.Option(None, help=HOSTFILE_HELP),
    node: str | None = typer.Option(None, help="Whose worker to show (default: rank 0's node)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until the job ends."),
    tail: int | None = typer.Option(
        None,
        "--tail",
        min=0,
        help="Only the last N lines of the job's output (default: all), unless --follow follows a running job.",
    ),
    env_file: Path | None = typer.Option(None, help=ENV_FILE_HELP),
    insecure_engine: bool = typer.Option(False, "--insecure-engine", help=INSECURE_HELP),
) -> None:
    """Show a worker's output; on rank 0's node, the training job's output too (also after the job ended).

    Example: launcher logs --nodes node_1,node_2 --follow
    """
    settings = settings_from(nodes, env_file, hostfile, insecure_engine)
    problem = clusters.node_problem(settings, node)
    if problem:
        fail(problem, 2)
    try:
        write_out(clusters.logs(engines_of(settings), node, follow, tail))
    except clusters.ClusterError as error:
        fail(str(error))


@app.command("doctor")
def doctor_command(
    nodes: str | None = typer.Option(None, help=NODES_HELP),
    hostfile: Path | None = typer.Option(None, help=HOSTFILE_HELP),
    image: str | None = typer.Option(None, help="Image to check (default horovod-stack:latest)."),
    ssh_port: int | None = typer.Option(None, help="Port the workers' sshd will use."),
    gpus: str | None = typer.Option(None, "--gpus", "--gpus-per-node", help="Check for these GPUs too: " + GPUS_HELP),
    network_interface: str | None = typer.Option(None, help=NIC_HELP),
    env_file: Path | None = typer.Option(None, help=ENV_FILE_HELP),
    insecure_engine: bool = typer.Option(False, "--insecure-engine", help=INSECURE_HELP),
    links: bool = typer.Option(
        False,
        help="Also measure every pair of nodes' link both ways (rate and round trip, between host-network containers "
        "of the image, over the job's NIC, on the SSH port) and predict one ring allreduce and one parameter-server "
        "exchange on the slowest link, with one line of advice against the compute per step.",
    ),
    gradient_mb: float | None = typer.Option(
        None, help="With --links: the gradient to predict for, in MB (default: the bundled trainer's SimpleNet)."
    ),
    link_seconds: float | None = typer.Option(
        None, help=f"With --links: the longest each direction of a pair streams (default {LINK_SECONDS:g} s)."
    ),
    compute_ms: float | None = typer.Option(
        None,
        help="With --links: the compute of one training step in ms, for the advice (default: the bundled trainer's, "
        "measured once on rank 0's node; needed with --gradient-mb).",
    ),
) -> None:
    """Check every node: engine reachable, same image everywhere, GPUs visible, SSH port free, NIC there, clock skew;
    with --links, the links between them and what they mean for an allreduce.

    Example: launcher doctor --nodes node_1,node_2 --network-interface ens5 --links
    """
    problem = doctor.link_options_problem(links, gradient_mb, link_seconds, compute_ms)
    if problem:
        fail(problem, 2)
    settings = settings_from(
        nodes,
        env_file,
        hostfile,
        insecure_engine,
        image=image,
        gpus=gpus,
        job={"ssh_port": ssh_port, "network_interface": network_interface},
    )
    problems, engines, views = doctor.check(settings, typer.echo)
    if links and problems:
        typer.echo("links: not measured: fix the problems above first")
    elif links:
        stop_on_signals()
        seconds = link_seconds or LINK_SECONDS
        try:
            problems = doctor.measure_links(
                settings, engines, views, gradient_mb, seconds, typer.echo, say, compute_ms=compute_ms
            )
        except Signalled as stop:
            fail(f"{STOPPED_BY[signal.Signals(stop.signum)]}; the link-test containers were removed", 128 + stop.signum)
    if problems:
        fail(f"{len(problems)} problem(s): {'; '.join(problems)}")
    typer.echo("all nodes ready")


class ExportKind(StrEnum):
    mpijob = "mpijob"


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def export(
    ctx: typer.Context,
    kind: ExportKind = typer.Argument(..., help="What to write: mpijob (a Kubeflow MPIJob, kubeflow.org/v2beta1)."),
    name: str = typer.Option(..., help="The MPIJob's name (a DNS-1035 label); pods are NAME-launcher, NAME-worker-I."),
    workers: int = typer.Option(..., help="Worker pods, one rank per slot each."),
    slots: int | None = typer.Option(None, help="Ranks per worker on CPUs (default 1)."),
    gpus_per_node: int = typer.Option(0, help="GPUs per worker (nvidia.com/gpu), one rank each; 0: CPU ranks."),
    image: str | None = typer.Option(
        None, help="The image as the nodes pull it, REGISTRY/NAME:TAG or @DIGEST (default: IMAGE in .env); required."
    ),
    namespace: str | None = typer.Option(None, help="The namespace (default: default)."),
    shared_claim: str | None = typer.Option(
        None, help="PersistentVolumeClaim mounted at /shared in every pod (default horovod-stack-shared)."
    ),
    env: list[str] | None = typer.Option(None, "--env", help="KEY=VALUE for every rank (repeatable)."),
    secret: list[str] | None = typer.Option(
        None,
        "--secret",
        help="NAME=SECRET/KEY: every rank gets NAME from key KEY of the Kubernetes Secret SECRET (valueFrom."
        "secretKeyRef; the document holds no value; repeatable).",
    ),
    cpu: str | None = typer.Option(None, help="Each worker's CPU, REQUEST[:LIMIT] (default: 1 per rank, no limit)."),
    memory: str | None = typer.Option(
        None, help="Each worker's memory, REQUEST[:LIMIT] (default: 2Gi per rank, no limit); /dev/shm counts in it."
    ),
    pod_security: str | None = typer.Option(
        None, help="The Pod Security profile the pods pass: baseline (default), restricted or privileged."
    ),
    ptrace: bool = typer.Option(False, help="Workers get SYS_PTRACE for `launcher stacks` (needs privileged)."),
    rdma: bool = typer.Option(False, help="Workers get IPC_LOCK for RDMA's locked memory (needs privileged)."),
    run_as_user: str | None = typer.Option(
        None, help="The pods' user id (default 1000, the image's user), or `platform` to leave it to the platform."
    ),
    schedule_timeout: int | None = typer.Option(
        None, help="Seconds the job waits for all its workers to start before it fails (default: no limit)."
    ),
    deadline: int | None = typer.Option(
        None, help="Seconds the whole job may take, the wait included (runPolicy.activeDeadlineSeconds)."
    ),
    scheduler: str | None = typer.Option(
        None, help="volcano or scheduler-plugins (gang scheduling: runPolicy.schedulingPolicy), or kueue."
    ),
    queue: str | None = typer.Option(None, help="The Volcano Queue or Kueue LocalQueue (with --scheduler)."),
    priority_class: str | None = typer.Option(None, help="The pods' PriorityClass (and the PodGroup's)."),
    suspend: bool = typer.Option(False, help="Create the MPIJob suspended (runPolicy.suspend), to resume later."),
    elastic: bool = typer.Option(False, help="Refused: elastic MPIJobs are not supported (docs/kubernetes.md)."),
    min_workers: int | None = typer.Option(None, help="Refused, with --elastic."),
    network_interface: str | None = typer.Option(
        None, help="The pods' NIC for Open MPI, NCCL and Gloo (default: none; virtual NICs left out)."
    ),
    env_file: Path | None = typer.Option(None, help=ENV_FILE_HELP),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the document here (default: stdout)."),
) -> None:
    """Write the job as a document another scheduler runs: the same image, command and Horovod defaults.

    Example: launcher export mpijob --name digits --workers 2 --gpus-per-node 2 --image registry.example.com/
    horovod-stack:1 -o digits.yaml -- --dataset digits --epochs 5; then kubectl apply -f digits.yaml
    """
    from launcher.k8s import mpijob  # PyYAML, only here

    command = checked_command(ctx)
    try:
        request = mpijob.request(
            job={
                "command": command,
                "env": tuple(env or ()),
                "elastic": elastic,
                "elastic_min_workers": min_workers,
                "network_interface": network_interface,
                "ready_timeout": schedule_timeout,
                "ptrace": ptrace,
            },
            name=name,
            workers=workers,
            slots=slots,
            gpus_per_node=gpus_per_node,
            image=image or load_env_file(env_file).get("IMAGE"),
            namespace=namespace,
            shared_claim=shared_claim,
            secret_refs=tuple(secret or ()),
            cpu=cpu,
            memory=memory,
            pod_security=pod_security,
            rdma=rdma,
            run_as_user=run_as_user,
            deadline=deadline,
            scheduler=scheduler,
            queue=queue,
            priority_class=priority_class,
            suspend=suspend,
        )
    except SettingsError as error:
        fail(str(error), 2)
    text = mpijob.to_yaml(request)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        say(f"wrote MPIJob {name} to {output}; apply it with `kubectl apply -f {output}`")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
