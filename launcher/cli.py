"""The `launcher` command line: parses flags and .env, calls session/driver, prints. No logic of its own."""

from __future__ import annotations

import signal
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import NoReturn

import typer

from app.model_size import SIMPLENET_GRADIENT_MB, SIMPLENET_PARAMETERS
from launcher import jobstate, linkcheck, linkprobe, session
from launcher import links as links_home
from launcher import results as results_home
from launcher.driver import HostView, NodeDriver, NodeError
from launcher.plan import (
    LABEL_CLUSTER,
    LABEL_RANKS,
    LABEL_ROLE,
    NIC_SETTING,
    job_command,
    nic_in_subnet,
    nic_problem,
    run_dir,
    subnet_of,
    subnet_problem,
    virtual_subnets,
)
from launcher.protocol import AGENT, JOB_LOG, JOB_STALL, JOB_STATUS, STOP_SIGNALS, Signalled
from launcher.settings import LaunchSettings, SettingsError, load_env_file, resolve_settings

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
    echo_to_stderr(f"error: {message}")
    raise typer.Exit(code)


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


def settings_from(nodes: str | None, env_file: Path | None, hostfile: Path | None, **flags) -> LaunchSettings:
    try:
        return resolve_settings(load_env_file(env_file), nodes=nodes, hostfile=hostfile, **flags)
    except SettingsError as error:
        fail(str(error), 2)


def connect(settings: LaunchSettings) -> list[NodeDriver]:
    try:
        return session.connect_all(settings.plan(cluster_id="-"), lambda _: None)
    except session.LaunchError as error:
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
    if min_nodes is not None and not elastic:
        fail("--min-nodes is for elastic jobs: add --elastic", 2)
    if restart_workers and detach:
        fail("--restart-workers needs the launcher to stay attached (it restarts the workers): drop --detach", 2)
    settings = settings_from(
        nodes,
        env_file,
        hostfile,
        slots=slots,
        gpus=gpus,
        image=image,
        ssh_port=ssh_port,
        network_interface=network_interface,
        command=tuple(job_command(ctx.args)),
        env_vars=(*(env or ()), *(["NCCL_DEBUG=INFO"] if debug else [])),
        workdir=workdir,
        elastic_min_nodes=(min_nodes or 1) if elastic else None,
        elastic_max_nodes=max_nodes,
        restart_workers=restart_workers,
        devices=tuple(device or ()),
        stall_timeout=stall_timeout,
        stall_action=stall_action,
        mounts=tuple(mount or ()),
    )
    if dry_run:
        try:
            session.dry_run(settings, push_image=push_image, say=say)
        except (session.LaunchError, NodeError) as error:
            fail(str(error))
        raise typer.Exit(0)
    stop_on_signals()
    try:
        status = session.launch(
            settings, push_image=push_image, detach=detach, keep_running=keep_running, say=say, relay=echo_to_stderr
        )
    except (session.LaunchError, NodeError) as error:
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
) -> None:
    """Remove the stack's containers on the nodes, running or ended.

    Example: launcher stop --nodes node_1,node_2 --cluster 3f9a1c2e
    """
    settings = settings_from(nodes, env_file, hostfile)
    for driver in connect(settings):
        removed = driver.remove_cluster(cluster)
        typer.echo(f"{driver.node.name}: removed {removed} container(s)")


@app.command()
def status(
    nodes: str | None = typer.Option(None, help=NODES_HELP),
    hostfile: Path | None = typer.Option(None, help=HOSTFILE_HELP),
    env_file: Path | None = typer.Option(None, help=ENV_FILE_HELP),
) -> None:
    """Each cluster's job (running: epoch, accuracy, throughput; succeeded; failed, with its cause) and containers.

    Example: launcher status --nodes node_1,node_2
    """
    settings = settings_from(nodes, env_file, hostfile)
    drivers = connect(settings)
    found = False
    for driver in drivers:
        for container in driver.cluster_containers():
            if container.labels.get(LABEL_ROLE) != "rank0":
                continue
            found = True
            cluster = container.labels.get(LABEL_CLUSTER)
            members = [(d, c, d.container_state(c)) for d in drivers for c in d.cluster_containers(cluster)]
            state = jobstate.describe(
                driver.container_state(container),
                driver.read_file(container, JOB_STATUS),
                driver.read_file(container, JOB_LOG) or "",
                [m[2] for m in members],
                metrics=driver.read_file(container, f"{run_dir(cluster)}/metrics.jsonl"),
                stall=driver.read_file(container, JOB_STALL),
            )
            typer.echo(f"cluster {cluster}: {state}")
            for member_driver, member, member_state in members:
                ended = "" if member_state.running else f" (exit status {member_state.exit_code})"
                typer.echo(
                    f"  {member_driver.node.name}: {member.name} role={member.labels.get(LABEL_ROLE)} "
                    f"ranks={member.labels.get(LABEL_RANKS, '?')} {member.status}{ended}"
                )
    if not found:
        typer.echo("no cluster on " + ", ".join(driver.node.name for driver in drivers))


@app.command()
def results(
    nodes: str | None = typer.Option(None, help=NODES_HELP),
    hostfile: Path | None = typer.Option(None, help=HOSTFILE_HELP),
    cluster: str | None = typer.Option(None, help="Whose run (its cluster ID; default: the newest run)."),
    to: Path = typer.Option(Path("results"), help="Folder to copy the run folder into (made if missing)."),
    checkpoints: bool = typer.Option(True, help="Copy checkpoints/ too (--no-checkpoints leaves them there)."),
    env_file: Path | None = typer.Option(None, help=ENV_FILE_HELP),
) -> None:
    """Copy a run's folder (metrics.jsonl, summary.json, curves.png, tb/, checkpoints/) from its node to this
    machine, through the Docker API; the cluster may be running, ended or removed.

    Example: launcher results --nodes node_1,node_2 --to ./results
    """
    settings = settings_from(nodes, env_file, hostfile)
    drivers = connect(settings)
    try:
        run = results_home.choose(results_home.runs_on(drivers, settings.image, settings.shared_dir), cluster)
    except ValueError as error:
        fail(str(error))
    driver = next(d for d in drivers if d.node.name == run.node)
    to.mkdir(parents=True, exist_ok=True)
    written = results_home.extract(driver.run_archive(settings.image, settings.shared_dir, run.name), to, checkpoints)
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
) -> None:
    """Every rank's Python stack now, on every node (py-spy), identical stacks printed once: where a hung job hangs.

    Example: launcher stacks --nodes node_1,node_2
    """
    settings = settings_from(nodes, env_file, hostfile)
    rank0 = [
        (driver, container)
        for driver in connect(settings)
        for container in driver.cluster_containers(cluster)
        if container.labels.get(LABEL_ROLE) == "rank0" and container.status == "running"
    ]
    if not rank0:
        fail("no running cluster on these nodes: `launcher status` lists the clusters")
    driver, container = rank0[0]
    exec_id, stream = driver.exec_stream(container, [*AGENT, "stacks", *(["--native"] if native else [])])
    for chunk in stream:
        sys.stdout.write(chunk.decode(errors="replace"))
    sys.stdout.flush()
    raise typer.Exit(driver.exec_exit_code(exec_id) or 0)


@app.command()
def logs(
    nodes: str | None = typer.Option(None, help=NODES_HELP),
    hostfile: Path | None = typer.Option(None, help=HOSTFILE_HELP),
    node: str | None = typer.Option(None, help="Whose worker to show (default: rank 0's node)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until the job ends."),
    env_file: Path | None = typer.Option(None, help=ENV_FILE_HELP),
) -> None:
    """Show a worker's output; on rank 0's node, the training job's output too (also after the job ended).

    Example: launcher logs --nodes node_1,node_2 --follow
    """
    settings = settings_from(nodes, env_file, hostfile)
    name = node or settings.nodes[0]
    if name not in settings.nodes:
        fail(f"--node {name} is not one of --nodes {','.join(settings.nodes)}", 2)
    driver = next(d for d in connect(settings) if d.node.name == name)
    containers = driver.cluster_containers()
    if not containers:
        fail(f"{name}: no container of the stack there; start one with `launcher start`")
    container = containers[0]
    for chunk in container.logs(stream=True, follow=False):
        sys.stdout.write(chunk.decode(errors="replace"))
    job_log = driver.read_file(container, JOB_LOG)
    if container.status != "running" or job_log is None or not follow:  # ended jobs keep their output too
        sys.stdout.write(job_log or "")
    else:  # the job agent's follower: it returns once the job has ended
        _, stream = driver.exec_stream(container, [*AGENT, "follow"])
        for chunk in stream:
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()


@app.command()
def doctor(
    nodes: str | None = typer.Option(None, help=NODES_HELP),
    hostfile: Path | None = typer.Option(None, help=HOSTFILE_HELP),
    image: str | None = typer.Option(None, help="Image to check (default horovod-stack:latest)."),
    ssh_port: int | None = typer.Option(None, help="Port the workers' sshd will use."),
    gpus: str | None = typer.Option(None, "--gpus", "--gpus-per-node", help="Check for these GPUs too: " + GPUS_HELP),
    network_interface: str | None = typer.Option(None, help=NIC_HELP),
    env_file: Path | None = typer.Option(None, help=ENV_FILE_HELP),
    links: bool = typer.Option(
        False,
        help="Also measure every pair of nodes' link both ways (rate and round trip, between host-network containers "
        "of the image, over the job's NIC, on the SSH port) and predict one ring allreduce and one parameter-server "
        "exchange on the slowest link.",
    ),
    gradient_mb: float | None = typer.Option(
        None, help="With --links: the gradient to predict for, in MB (default: the bundled trainer's SimpleNet)."
    ),
    link_seconds: float | None = typer.Option(
        None, help=f"With --links: the longest each direction of a pair streams (default {linkprobe.SECONDS:g} s)."
    ),
) -> None:
    """Check every node: engine reachable, same image everywhere, GPUs visible, SSH port free, NIC there, clock skew;
    with --links, the links between them and what they mean for an allreduce.

    Example: launcher doctor --nodes node_1,node_2 --network-interface ens5 --links
    """
    if (gradient_mb is not None or link_seconds is not None) and not links:
        fail("--gradient-mb and --link-seconds are for the link test: add --links", 2)
    if (gradient_mb is not None and gradient_mb <= 0) or (link_seconds is not None and link_seconds <= 0):
        fail("--gradient-mb and --link-seconds take a positive number", 2)
    settings = settings_from(
        nodes,
        env_file,
        hostfile,
        image=image,
        ssh_port=ssh_port,
        gpus=gpus,
        network_interface=network_interface,
    )
    problems, image_ids = [], {}
    drivers, views = [], {}
    for node in settings.plan(cluster_id="-").nodes:
        try:
            driver = NodeDriver.connect(node)
        except NodeError as error:
            problems.append(str(error))
            typer.echo(f"{node.name}: engine        FAIL {error}")
            continue
        drivers.append(driver)
        typer.echo(f"{node.name}: engine        ok ({driver.client.version()['Version']} at {node.engine_url})")
        image_id = image_ids[node.name] = driver.image_id(settings.image)
        if image_id is None:
            problems.append(f"{node.name}: image {settings.image} missing")
            typer.echo(
                f"{node.name}: image         FAIL {settings.image} missing (launcher start --push-image copies it)"
            )
        else:
            typer.echo(f"{node.name}: image         ok ({image_id[7:19]})")
            view = views[node.name] = driver.host_view(settings.image, settings.ssh_port)
            if view.port_taken:
                problems.append(f"{node.name}: port {settings.ssh_port} in use")
            typer.echo(
                f"{node.name}: ssh port      {'FAIL in use' if view.port_taken else 'ok free'} ({settings.ssh_port})"
            )
            subnet = subnet_of(settings.network_interface)
            if subnet:
                nic = subnet_problem(subnet, view.addresses)
                own = nic_in_subnet(view.addresses, subnet)
                found = ", ".join(f"{name} {address}" for name, address in view.addresses if name == own)
                typer.echo(f"{node.name}: network iface {'FAIL ' + nic if nic else 'ok'} ({found or subnet})")
            elif settings.network_interface:
                nic = nic_problem(settings.network_interface, view.nics)
                typer.echo(
                    f"{node.name}: network iface {'FAIL ' + nic if nic else 'ok'} ({settings.network_interface})"
                )
            else:
                nic = None
                left_out = ", ".join(virtual_subnets(view.addresses)) or "none here"
                typer.echo(f"{node.name}: network iface ok (none pinned; virtual NICs left out: {left_out})")
            if nic:
                problems.append(f"{node.name}: {nic}")
        gpu_request = settings.plan(cluster_id="-").gpu_request(node)
        if gpu_request and image_id is not None:  # nvidia-smi runs in a container of the image
            gpu = driver.gpu_problem(settings.image, gpu_request)
            if gpu:
                problems.append(f"{node.name}: {gpu}")
            typer.echo(f"{node.name}: GPUs          {'FAIL ' + gpu if gpu else 'ok'} ({gpu_request} asked for)")
        skew = driver.clock_skew_seconds()
        if abs(skew) > 5:
            problems.append(f"{node.name}: clock skew {skew:.1f} s")
        typer.echo(f"{node.name}: clock skew    {'ok' if abs(skew) <= 5 else 'FAIL'} ({skew:+.1f} s)")
    present = {i for i in image_ids.values() if i}
    if len(present) > 1:
        problems.append("image IDs differ between nodes")
        typer.echo("all: image         FAIL the image ID differs between nodes")
    if links and problems:
        typer.echo("links: not measured: fix the problems above first")
    elif links:
        problems += doctor_links(settings, drivers, views, gradient_mb, link_seconds or linkprobe.SECONDS)
    if problems:
        fail(f"{len(problems)} problem(s): {'; '.join(problems)}")
    typer.echo("all nodes ready")


def doctor_links(
    settings: LaunchSettings,
    drivers: list[NodeDriver],
    views: dict[str, HostView],
    gradient_mb: float | None,
    seconds: float,
) -> list[str]:
    """`doctor --links`: prints the matrix and the prediction; returns the problems (unreachable pairs)."""
    plan = settings.plan(cluster_id="-")
    names = [node.name for node in plan.nodes]
    if len(names) < 2:
        typer.echo("links: one node, no link to measure")
        return []
    stop_on_signals()
    try:
        measured = linkcheck.measure(plan, drivers, views, seconds, say)
    except NodeError as error:
        return [str(error)]
    except Signalled as stop:
        fail(f"{STOPPED_BY[signal.Signals(stop.signum)]}; the link-test containers were removed", 128 + stop.signum)
    good = [result for result in measured if isinstance(result, links_home.Link)]
    failed = [result for result in measured if isinstance(result, links_home.Unreachable)]
    over = f"over {plan.network_interface}" if plan.network_interface else "by node name (no NIC pinned)"
    typer.echo(
        f"links: host-network containers, {over}, TCP port {plan.ssh_port}, {seconds:g} s each way; "
        "from the row's node to the column's"
    )
    if good:
        for line in links_home.format_matrix(names, good):
            typer.echo(f"  {line}")
    for failure in failed:
        typer.echo(f"links: FAIL {links_home.unreachable_line(failure)}")
    if failed:
        return [links_home.unreachable_line(failure) for failure in failed]
    what = "--gradient-mb" if gradient_mb else f"the bundled trainer's SimpleNet, {SIMPLENET_PARAMETERS} floats"
    prediction = links_home.predict(good, gradient_mb or SIMPLENET_GRADIENT_MB, plan.total_ranks)
    for line in links_home.prediction_lines(prediction, what):
        typer.echo(f"links: {line}")
    return []


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
    image: str | None = typer.Option(None, help="The image, as the cluster pulls it (a registry name)."),
    namespace: str | None = typer.Option(None, help="The namespace (default: default)."),
    shared_claim: str | None = typer.Option(
        None, help="PersistentVolumeClaim mounted at /shared in every pod (default horovod-stack-shared)."
    ),
    env: list[str] | None = typer.Option(None, "--env", help="KEY=VALUE for every rank (repeatable)."),
    elastic: bool = typer.Option(False, help="Elastic training (horovodrun, Gloo): lost workers do not end the job."),
    min_workers: int | None = typer.Option(None, help="With --elastic: the fewest workers the job goes on with."),
    network_interface: str | None = typer.Option(
        None, help="The pods' NIC for Open MPI, NCCL and Gloo (elastic default: eth0; none: virtual NICs left out)."
    ),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the document here (default: stdout)."),
) -> None:
    """Write the job as a document another scheduler runs: the same image, command and Horovod defaults.

    Example: launcher export mpijob --name digits --workers 2 --gpus-per-node 2 --image registry.example.com/
    horovod-stack:latest -o digits.yaml -- --dataset digits --epochs 5; then kubectl apply -f digits.yaml
    """
    from launcher import mpijob  # PyYAML, only here

    if min_workers is not None and not elastic:
        fail("--min-workers is for elastic jobs: add --elastic", 2)
    request = mpijob.MpiJobRequest(
        name=name,
        workers=workers,
        command=tuple(job_command(ctx.args)),
        slots=slots,
        gpus_per_node=gpus_per_node,
        image=image or mpijob.DEFAULT_IMAGE,
        namespace=namespace or mpijob.DEFAULT_NAMESPACE,
        shared_claim=shared_claim or mpijob.DEFAULT_CLAIM,
        env=tuple(env or ()),
        elastic_min_workers=(min_workers or 1) if elastic else None,
        network_interface=network_interface,
    )
    try:
        text = mpijob.to_yaml(request)
    except ValueError as error:
        fail(str(error).splitlines()[0], 2)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        say(f"wrote MPIJob {name} to {output}; apply it with `kubectl apply -f {output}`")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
