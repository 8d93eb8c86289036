"""The `launcher` command line: declares the commands and their flags (whose texts and meanings are
launcher/host/planning/flags.py's), calls one host-side function per command and prints what it returns. No logic of its
own: the settings are launcher/host/planning/settings.py's, the checks launcher/host/planning/preflight.py's, a launch
launcher/host/running/launch.py's, its signal policy launcher/host/running/signals.py's, the doctor
launcher/host/doctor/checkup.py's, the clusters already started launcher/host/running/clusters.py's, the MPIJob document
launcher/k8s/mpijob.py's.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from launcher.core.options import SettingsError
from launcher.core.protocol import Signalled
from launcher.host.doctor import checkup
from launcher.host.engines import streams
from launcher.host.engines.node_engine import NodeEngine, NodeError
from launcher.host.planning import export_flags, flags
from launcher.host.planning.settings import LaunchSettings, load_env_file, read_settings
from launcher.host.planning.trainer import checked_command
from launcher.host.running import clusters, launch, ranklogs
from launcher.host.running.rootcause import LaunchError, unforeseen
from launcher.host.running.signals import stop_on_signals, stopped
from launcher.slurm import sbatch_request

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Run Horovod training across Docker hosts: one worker container per node, mpirun from rank 0.",
)
EXTRA_WORDS = {"allow_extra_args": True, "ignore_unknown_options": True}
"""start and export pass the words they do not take on to the job, as its command."""


def typer_parameter(row: flags.Flag, hidden: bool = False) -> inspect.Parameter:
    """The typer parameter of one row of flags.FLAGS (or of an export kind's): its type, spellings and --help (the
    row's text, default included), not given by default (.env or the default decides) unless the row is required;
    `hidden`: parsed, to be refused in one line, but left out of --help."""
    kind = {tuple: list[str], bool: bool}.get(row.kind, row.kind if row.required else row.kind | None)
    option = typer.Option(*row.spellings, help=row.text, show_default=False, hidden=hidden)
    default = inspect.Parameter.empty if row.required else False if row.kind is bool else None
    return inspect.Parameter(
        row.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, option]
    )


def with_flags(
    *rows: flags.Flag, hidden: tuple[flags.Flag, ...] = ()
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A command whose parameters (after its typer.Context) are made from rows of flags.FLAGS (or an export kind's),
    then the `hidden` rows (parsed, left out of --help); it takes them as keyword arguments, by row name."""

    def made(command: Callable[..., None]) -> Callable[..., None]:
        context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
        parameters = [*map(typer_parameter, rows), *(typer_parameter(row, hidden=True) for row in hidden)]
        command.__signature__ = inspect.Signature([context, *parameters])  # type: ignore[attr-defined]
        command.__annotations__ = {}
        return command

    return made


# The flags every command that reaches the nodes takes, from their rows in flags.FLAGS.
Nodes = Annotated[str | None, typer.Option(help=flags.NODES.text)]
Hostfile = Annotated[Path | None, typer.Option(help=flags.HOSTFILE.text)]
EnvFile = Annotated[Path | None, typer.Option(help=flags.ENV_FILE.text)]
InsecureEngine = Annotated[bool, typer.Option(*flags.INSECURE.spellings, help=flags.INSECURE.text)]


def echo_to_stderr(line: str) -> None:
    try:
        typer.echo(line, err=True)
    except OSError:  # a closed terminal (SIGHUP) must not stop the cleanup that follows
        pass


def say(message: str) -> None:
    for line in message.splitlines():
        echo_to_stderr(f"[launcher {time.strftime('%H:%M:%S')}] {line}")


def say_error(message: str) -> None:
    for line in message.splitlines() or [""]:
        echo_to_stderr(f"error: {line}")


def fail(message: str, code: int = 1) -> NoReturn:
    say_error(message)
    raise typer.Exit(code)


def settings_from(env_file: Path | None, **given: Any) -> LaunchSettings:
    """The command's settings (exit 2 on a bad one), the warning about engines others could read said once."""
    try:
        settings, warning = read_settings(env_file, **given)
    except SettingsError as error:
        fail(str(error), 2)
    if warning:
        echo_to_stderr(warning)
    return settings


def command_of(ctx: typer.Context) -> tuple[str, ...]:
    """The job's command from the words the command did not take, checked before any node is contacted (exit 2)."""
    ours = [name for param in ctx.command.get_params(ctx) for name in (*param.opts, *param.secondary_opts)]
    try:
        return checked_command(ctx.args, ours)
    except SettingsError as error:
        fail(str(error), 2)


def reading_image(image: str | None, env_file: Path | None) -> str | None:
    """The image `logs` and `results` were told to read the shared folder with (--image, IMAGE in .env); None: each
    node's own choice (clusters.reading_image: the image its cluster ran, or one of the stack's it holds)."""
    return image or load_env_file(env_file).get(flags.ROWS["image"].key or "")


def engines_of(settings: LaunchSettings) -> list[NodeEngine]:
    try:
        return launch.connect_all(settings, lambda _: None)
    except LaunchError as error:
        fail(str(error))


@app.command(context_settings=EXTRA_WORDS)
@with_flags(*flags.FLAGS)
def start(ctx: typer.Context, **given: Any) -> None:
    """Start a worker on every node and run a job; rank 0's output streams here and the exit status is the job's.

    Your own script: launcher start --nodes node_1,node_2 --workdir ./code -- python train.py --epochs 5
    (after --, a command every rank runs, as with mpirun). The bundled trainer: launcher start --nodes
    node_1,node_2 --slots 2 -- --dataset digits --epochs 5 (options alone go to python -m app.train).
    Elastic: launcher start --nodes node_1,node_2,node_3 --elastic --min-nodes 2 --network-interface eth0
    (the elastic driver runs on rank 0's node: losing that node ends the job).
    Restarted: launcher start --nodes node_1,node_2,node_3 --max-restarts 3 --min-nodes 2 -- --epochs 20
    (a lost node's job starts again from its newest checkpoint, on the nodes that remain).

    The job runs in the cluster (a job agent in rank 0's container), not in this process: Ctrl-C, SIGTERM or a
    closed terminal remove the cluster on every node (exit 130, 143, 129); if this process dies outright, the job
    goes on, every container stops when it ends, and `launcher status` says how it ended.
    """
    command = command_of(ctx)
    settings = settings_from(given["env_file"], **flags.start_settings(given, command))
    if given["dry_run"]:
        try:
            launch.dry_run(settings, say=say)
        except (LaunchError, NodeError) as error:
            fail(str(error))
        raise typer.Exit(0)
    stop_on_signals()
    try:
        status = launch.launch(settings, say=say, relay=echo_to_stderr)
    except (LaunchError, NodeError) as error:
        fail(str(error))
    except Signalled as stop:
        fail(*stopped(stop, "the cluster's containers were"))
    except Exception as error:  # anything unforeseen still ends as one line; cleanup already ran
        fail(f"{unforeseen(error)}; the cluster's containers were removed")
    raise typer.Exit(status)


@app.command()
def stop(
    nodes: Nodes = None,
    hostfile: Hostfile = None,
    cluster: str | None = typer.Option(
        None, help="Cluster ID, as `launcher status` shows it (default: every cluster of this stack)."
    ),
    env_file: EnvFile = None,
    insecure_engine: InsecureEngine = False,
) -> None:
    """Remove the stack's containers on the nodes, running or ended.

    Example: launcher stop --nodes node_1,node_2 --cluster 3f9a1c2e
    """
    settings = settings_from(env_file, nodes=nodes, hostfile=hostfile, insecure_engines=insecure_engine)
    for line in clusters.stop(engines_of(settings), cluster):
        typer.echo(line)


@app.command()
def status(
    nodes: Nodes = None,
    hostfile: Hostfile = None,
    env_file: EnvFile = None,
    insecure_engine: InsecureEngine = False,
) -> None:
    """Each cluster's job (running: epoch, accuracy, throughput; succeeded; failed, with its cause) and containers.

    Example: launcher status --nodes node_1,node_2
    """
    settings = settings_from(env_file, nodes=nodes, hostfile=hostfile, insecure_engines=insecure_engine)
    for line in clusters.status(engines_of(settings)):
        typer.echo(line)


@app.command()
def results(
    nodes: Nodes = None,
    hostfile: Hostfile = None,
    cluster: str | None = typer.Option(
        None, help="Whose run (its cluster ID, as `launcher status` shows it; default: the newest run)."
    ),
    to: Path = typer.Option(Path("results"), help="Folder to copy the run folder into (made if missing)."),
    checkpoints: bool = typer.Option(True, help="Copy checkpoints/ too (--no-checkpoints leaves them there)."),
    image: str | None = typer.Option(None, help=flags.READING_IMAGE),
    env_file: EnvFile = None,
    insecure_engine: InsecureEngine = False,
) -> None:
    """Copy a run's folder (metrics.jsonl, summary.json, curves.png, tb/, checkpoints/) from its node to this
    machine, through the Docker API; the cluster may be running, ended or removed.

    Example: launcher results --nodes node_1,node_2 --to ./results
    """
    settings = settings_from(env_file, nodes=nodes, hostfile=hostfile, image=image, insecure_engines=insecure_engine)
    try:
        run, written = clusters.fetch_results(
            engines_of(settings), reading_image(image, env_file), settings.shared_dir, cluster, to, checkpoints
        )
    except clusters.ClusterError as error:
        fail(str(error))
    say(f"run {run.name} from {run.node}: {len(written)} file(s) in {to / run.name}")
    for name in written:
        typer.echo(str(to / name))


@app.command()
def stacks(
    nodes: Nodes = None,
    hostfile: Hostfile = None,
    cluster: str | None = typer.Option(
        None, help="Cluster ID, as `launcher status` shows it (default: the running one)."
    ),
    native: bool = typer.Option(False, help="Native (C/C++) frames too, e.g. inside Horovod's or NCCL's code."),
    env_file: EnvFile = None,
    insecure_engine: InsecureEngine = False,
) -> None:
    """Every rank's Python stack now, on every node (py-spy), identical stacks printed once: where a hung job hangs.

    Example: launcher stacks --nodes node_1,node_2
    """
    settings = settings_from(env_file, nodes=nodes, hostfile=hostfile, insecure_engines=insecure_engine)
    try:
        stream, engine, exec_id = clusters.stacks(engines_of(settings), cluster, native)
    except clusters.ClusterError as error:
        fail(str(error))
    streams.write_decoded(stream, sys.stdout)
    raise typer.Exit(engine.exec_exit_code(exec_id) or 0)


@app.command()
def logs(
    nodes: Nodes = None,
    hostfile: Hostfile = None,
    node: str | None = typer.Option(None, help=flags.LOGS["node"]),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until the job ends."),
    tail: int | None = typer.Option(
        None,
        "--tail",
        min=0,
        help="Only the last N lines of the job's output (default: all), unless --follow follows a running job.",
    ),
    rank: int | None = typer.Option(None, min=0, help=flags.LOGS["rank"]),
    grep: str | None = typer.Option(None, help=flags.LOGS["grep"]),
    tee: Path | None = typer.Option(None, help=flags.LOGS["tee"]),
    image: str | None = typer.Option(None, help=flags.READING_IMAGE),
    env_file: EnvFile = None,
    insecure_engine: InsecureEngine = False,
) -> None:
    """Show a worker's output; on rank 0's node, the training job's output too (also after the job ended).

    Example: launcher logs --nodes node_1,node_2 --follow; one rank's lines: launcher logs --rank 0 --grep epoch
    """
    settings = settings_from(env_file, nodes=nodes, hostfile=hostfile, image=image, insecure_engines=insecure_engine)
    problem = clusters.node_problem(settings, node)
    if problem:
        fail(problem, 2)
    try:
        engines, wanted = engines_of(settings), reading_image(image, env_file)
        own, job, kept = clusters.logs(engines, node, follow, tail, wanted, settings.shared_dir)
        if kept:
            echo_to_stderr(f"note: {kept}")
        note = ranklogs.show(own, job, sys.stdout, rank, grep, ranklogs.Tee(tee) if tee else None, node)
    except clusters.ClusterError as error:
        fail(str(error))
    if note:
        echo_to_stderr(f"note: {note}")


@app.command("doctor")
def doctor_command(
    nodes: Nodes = None,
    hostfile: Hostfile = None,
    image: str | None = typer.Option(None, help=flags.DOCTOR["image"]),
    ssh_port: int | None = typer.Option(None, help=flags.DOCTOR["ssh_port"]),
    gpus: str | None = typer.Option(None, "--gpus", "--gpus-per-node", help=flags.DOCTOR["gpus"]),
    network_interface: str | None = typer.Option(None, help=flags.ROWS["network_interface"].text),
    env_file: EnvFile = None,
    insecure_engine: InsecureEngine = False,
    links: bool = typer.Option(False, help=flags.DOCTOR["links"]),
    gradient_mb: float | None = typer.Option(None, help=flags.DOCTOR["gradient_mb"]),
    link_seconds: float | None = typer.Option(None, help=flags.DOCTOR["link_seconds"]),
    compute_ms: float | None = typer.Option(None, help=flags.DOCTOR["compute_ms"]),
    push_image: bool = typer.Option(False, help=flags.DOCTOR["push_image"]),
) -> None:
    """Check every node: engine reachable, same image everywhere, SSH port free, NIC there, names, clock skew; with
    --gpus, the GPUs too; with --links, the links between them and what they mean for an allreduce; with
    --push-image, the image copied first to the nodes that lack it.

    Example: launcher doctor --nodes node_1,node_2 --network-interface ens5 --links --push-image
    """
    problem = checkup.link_options_problem(links, gradient_mb, link_seconds, compute_ms)
    if problem:
        fail(problem, 2)
    settings = settings_from(
        env_file,
        nodes=nodes,
        hostfile=hostfile,
        insecure_engines=insecure_engine,
        image=image,
        gpus=gpus,
        push_image=push_image,
        job={"ssh_port": ssh_port, "network_interface": network_interface},
    )
    try:
        problems = checkup.examine(
            settings,
            typer.echo,
            say,
            with_links=links,
            gradient_mb=gradient_mb,
            link_seconds=link_seconds,
            compute_ms=compute_ms,
        )
    except Signalled as stop:
        removed = "the link-test containers were"
        fail(*stopped(stop, f"the image copy was stopped and {removed}, if any," if push_image else removed))
    line, code = checkup.verdict(problems)
    if code:
        fail(line, code)
    typer.echo(line)


export_app = typer.Typer(
    no_args_is_help=True,
    help="Write the job as a document another scheduler runs: the same image, command and Horovod defaults.",
)
app.add_typer(export_app, name="export")


def write_out(text: str, output: Path | None, wrote: str) -> None:
    """The kind's text to stdout, or into `output` with one line saying what was written and what to run next."""
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        say(wrote)


@export_app.command("mpijob", context_settings=EXTRA_WORDS)
@with_flags(*export_flags.MPIJOB)
def export_mpijob(ctx: typer.Context, **given: Any) -> None:
    """A Kubeflow MPIJob (kubeflow.org/v2beta1).

    Example: launcher export mpijob --name digits --workers 2 --gpus-per-node 2 --image registry.example.com/
    horovod-stack:1 -o digits.yaml -- --dataset digits --epochs 5; then kubectl apply -f digits.yaml
    """
    from launcher.k8s import mpijob, mpijob_request  # PyYAML, only here

    command = command_of(ctx)
    chosen = export_flags.keywords(export_flags.MPIJOB, given, command)
    chosen["image"] = chosen["image"] or load_env_file(given["env_file"]).get(flags.ROWS["image"].key or "")
    try:
        request = mpijob_request.request(**chosen)
    except SettingsError as error:
        fail(str(error), 2)
    output = given["output"]
    write_out(
        mpijob.to_yaml(request),
        output,
        f"wrote MPIJob {request.name} to {output}; apply it with `kubectl apply -f {output}`",
    )


SBATCH_REFUSED = tuple(row for row in flags.FLAGS if row.flag in sbatch_request.NOT_ON_SLURM)
"""`launcher start`'s flags that mean nothing on Slurm: taken by `export sbatch` only to be refused in one line."""


@export_app.command("sbatch", context_settings=EXTRA_WORDS)
@with_flags(*export_flags.SBATCH, hidden=SBATCH_REFUSED)
def export_sbatch(ctx: typer.Context, **given: Any) -> None:
    """A Slurm batch script: every rank a Slurm task (srun) in the image's SIF under Apptainer.

    Example: launcher export sbatch --nodes 2 --gpus-per-node 4 --sif /cluster/horovod-stack.sif --shared
    /cluster/team/shared --partition gpu --time 2:00:00 -o digits.sbatch -- --dataset digits --epochs 5; then sbatch
    digits.sbatch (docs/slurm.md)
    """
    from launcher.slurm import sbatch

    command = command_of(ctx)
    chosen = export_flags.keywords(export_flags.SBATCH, given, command)
    refused = tuple(row.flag for row in SBATCH_REFUSED if given[row.name] not in (None, False, []))
    try:
        settings = load_env_file(given["env_file"])
        for row in export_flags.SBATCH_FROM_ENV:
            chosen[row.name] = chosen[row.name] or settings.get(row.key or "")
        # Paths on the cluster, as seen from the folder this runs in (the cluster's login node, as a rule).
        for where, name in ((chosen, "sif"), (chosen, "shared"), (chosen["job"], "workdir")):
            where[name] = os.path.abspath(where[name]) if where[name] else where[name]
        request = sbatch_request.request(**chosen, refused=refused)
    except SettingsError as error:
        fail(str(error), 2)
    output, secrets = given["output"], request.job.secrets
    told = f"; the secrets ({', '.join(secrets)}) come from the environment sbatch runs in" if secrets else ""
    write_out(
        sbatch.script(request), output, f"wrote the batch script to {output}; submit it with `sbatch {output}`{told}"
    )


def main() -> None:
    """The CLI; a node's engine failing a request ends any command with its one line (NodeError names the node)."""
    try:
        app()
    except NodeError as error:
        say_error(str(error))
        sys.exit(1)


if __name__ == "__main__":
    main()
