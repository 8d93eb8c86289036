"""The container half of scripts/gpu-check-tensorflow.sh, run in horovod-stack:tensorflow started with `--gpus all`
(the script mounts this file read-only):

    python gpu_check_tensorflow.py allreduce --ranks N   # N ranks of `rank` under mpirun, NCCL_DEBUG=INFO, judged
    python gpu_check_tensorflow.py trainer --ranks N     # N ranks of the bundled Keras trainer under mpirun, judged
    python gpu_check_tensorflow.py rank ...              # one rank of the allreduce check (mpirun starts it)

allreduce and trainer start mpirun in this container (one rank per GPU), echo the ranks' output, write their files to
--out and end with one line, `allreduce-check: PASS ...` or `trainer-check: FAIL <why>`; the exit status is 0 only
on PASS. The rank's check: rank r contributes (r + 1) x pattern (small integers, never zero) as a GPU tensor, so the
sum over N ranks is exactly N (N + 1) / 2 x pattern in float32, checked element by element, and the average too.
What carried it is judged from three sources: hvd.nccl_built(), NCCL's own INFO lines (each rank's communicator
"Init COMPLETE") and Horovod's timeline (NCCL_ALLREDUCE). Only the rank imports TensorFlow; the rest is the standard
library and the stack's own pure modules (app/, launcher/: the image's PYTHONPATH), so the judging runs (and is unit
tested) anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from app.gpu import GPUS_ASKED
from app.metrics import read_records
from launcher.smoke.trainer import read_summary

ALLREDUCE_SIZES = "1000,1048576,16777216"
"""float32 elements per tensor: 4 KB, 4 MB and 64 MB."""
MIN_ACCURACY = 0.5
"""The trainer's last validation accuracy must reach this (digits after 3 epochs: about 0.9 on CPUs)."""
TRAINER_EPOCHS = 3


@dataclass(frozen=True)
class Verdict:
    ok: bool
    text: str


# --- what carried the allreduce ---------------------------------------------------------------------------------
INIT_COMPLETE = re.compile(r"NCCL INFO .*\brank (\d+) nranks (\d+)\b.*Init COMPLETE")
COMM_LINE = re.compile(r"NCCL INFO .*\bcomm 0x[0-9a-fA-F]+ rank (\d+) nranks (\d+)\b")
NCCL_VERSION = re.compile(r"NCCL version (\S+)")
TRANSPORT = re.compile(r"NCCL INFO Channel \d+/\d+ :.* via (\S+)")
NCCL_WARN = re.compile(r"NCCL WARN (.*)")


def nccl_evidence(output: str, ranks: int) -> Verdict:
    """Whether NCCL's NCCL_DEBUG=INFO lines in the ranks' output show a communicator of `ranks` ranks set up on every
    rank. Each rank's communicator says `comm 0x... rank R nranks N ... - Init COMPLETE` (NCCL 2.4 to 2.2x write it
    with or without a leading `ncclCommInitRank`, and mpirun may prefix a rank tag); an NCCL whose lines lack
    "Init START" and "Init COMPLETE" is taken at its `comm 0x... rank R nranks N` lines."""
    warnings = NCCL_WARN.findall(output)
    warned = f"; NCCL WARN {warnings[0].strip()}" if warnings else ""
    if "NCCL INFO" not in output:
        return Verdict(False, f"no 'NCCL INFO' line: NCCL did not start (or NCCL_DEBUG=INFO missed the ranks){warned}")
    if "Init COMPLETE" in output:
        ready = {(int(rank), int(size)) for rank, size in INIT_COMPLETE.findall(output)}
    elif "Init START" in output:
        return Verdict(False, f"NCCL started a communicator but no rank says 'Init COMPLETE'{warned}")
    else:
        ready = {(int(rank), int(size)) for rank, size in COMM_LINE.findall(output)}
    missing = [rank for rank in range(ranks) if (rank, ranks) not in ready]
    if missing:
        seen = ", ".join(f"rank {rank} of {size}" for rank, size in sorted(ready)) or "none"
        return Verdict(False, f"no NCCL communicator of {ranks} rank(s) on rank(s) {missing} (seen: {seen}){warned}")
    version = NCCL_VERSION.search(output)
    transports = sorted(set(TRANSPORT.findall(output)))
    return Verdict(
        True,
        f"NCCL {version.group(1) if version else '(version not printed)'}: a communicator of {ranks} rank(s) "
        f"'Init COMPLETE' on every rank" + (f", channels via {', '.join(transports)}" if transports else ""),
    )


def nccl_release(code: int) -> str:
    """hvd.nccl_built()'s NCCL_VERSION_CODE as a release: 23207 is 2.32.7 (codes below 10000: 2.8 and older)."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def timeline_allreduces(text: str) -> list[str]:
    """The allreduce activities Horovod's timeline recorded (NCCL_ALLREDUCE, MPI_ALLREDUCE, GLOO_ALLREDUCE, ...)."""
    return sorted(set(re.findall(r"\b([A-Z]+_ALLREDUCE)\b", text)))


def last_error(output: str) -> str:
    """The ranks' last line that reads as an error, for a failure's one line; empty if none."""
    errors = [
        line.strip()
        for line in output.splitlines()
        if re.search(r"error|Error|ERROR|Traceback|Aborted|exited on signal", line) and "NCCL INFO" not in line
    ]
    return errors[-1][:300] if errors else ""


def exit_problem(rc: int | None, seconds: float, output: str) -> str | None:
    """mpirun's exit, as a problem (None when it exited 0)."""
    if rc == 0:
        return None
    what = f"timed out after {seconds:.0f} s" if rc is None else f"the ranks exited with status {rc}"
    error = last_error(output)
    return f"{what} ({error})" if error else what


def judge_allreduce(
    rc: int | None, seconds: float, output: str, values: dict | None, timeline: str | None, ranks: int
) -> Verdict:
    """The allreduce step's verdict: mpirun's exit, rank 0's values (--json), NCCL's lines and Horovod's timeline."""
    problems = [problem for problem in [exit_problem(rc, seconds, output)] if problem]
    if values is None:
        problems.append("rank 0 wrote no result")
        values = {}
    problems += values.get("problems", [])
    if values and values.get("ranks") != ranks:
        problems.append(f"Horovod started {values.get('ranks')} rank(s), not {ranks}")
    if values and not values.get("nccl_built"):
        problems.append("this image's Horovod has no NCCL ops (hvd.nccl_built() is 0)")
    nccl = nccl_evidence(output, ranks)
    if not nccl.ok:
        problems.append(nccl.text)
    ops = timeline_allreduces(timeline or "")
    if "NCCL_ALLREDUCE" not in ops:
        problems.append(f"Horovod's timeline shows {', '.join(ops) or 'no allreduce'}, not NCCL_ALLREDUCE")
    if problems:
        return Verdict(False, "; ".join(problems))
    figures = (
        f"{values['largest_mb']:.3g} MB in {values['allreduce_ms']:.2f} ms, "
        + (f"busbw {values['busbw_gb_s']:.1f} GB/s" if ranks > 1 else "1 rank: nothing crossed between GPUs")
        if "allreduce_ms" in values
        else ""
    )
    return Verdict(
        True,
        f"{ranks} rank(s) on {values.get('device_name', 'GPU')}: sums and averages of GPU tensors of "
        f"{values.get('sizes', '?')} floats exact; Horovod built with NCCL {nccl_release(values['nccl_built'])}; "
        f"{nccl.text}; "
        f"NCCL_ALLREDUCE in Horovod's timeline" + (f"; {figures}" if figures else ""),
    )


PLAN = re.compile(r"plan: (\d+) ranks on (\w+)")
IDENTICAL = re.compile(r"parameters identical on all (\d+) ranks \(sha256 ([0-9a-f]+)")


def judge_trainer(
    rc: int | None, seconds: float, output: str, summary: dict | None, metrics: list[dict], ranks: int
) -> Verdict:
    """The trainer step's verdict: it exited 0; its plan line says `ranks` ranks on cuda; every epoch is in
    metrics.jsonl with the last validation accuracy at least MIN_ACCURACY; it said 'parameters identical on all
    `ranks` ranks' and summary.json holds `ranks` ranks with that one digest; on 2 or more ranks NCCL's lines show
    the communicator that averaged the gradients (at 1 rank Horovod skips the gradients' allreduce)."""
    problems = [problem for problem in [exit_problem(rc, seconds, output)] if problem]
    plan = PLAN.search(output)
    if plan is None:
        problems.append("no plan line")
    elif (int(plan.group(1)), plan.group(2)) != (ranks, "cuda"):
        problems.append(f"the plan line says {plan.group(1)} ranks on {plan.group(2)}, not {ranks} on cuda")
    epochs = [record.get("epoch") for record in metrics]
    accuracy = float(metrics[-1].get("val_accuracy", 0.0)) if metrics else 0.0
    if epochs != list(range(1, TRAINER_EPOCHS + 1)):
        problems.append(f"metrics.jsonl holds epochs {epochs}, not 1-{TRAINER_EPOCHS}")
    elif accuracy < MIN_ACCURACY:
        problems.append(f"validation accuracy {accuracy:.3f} after {TRAINER_EPOCHS} epochs, under {MIN_ACCURACY}")
    identical = IDENTICAL.search(output)
    if identical is None:
        problems.append("no 'parameters identical on all N ranks' line")
    elif int(identical.group(1)) != ranks:
        problems.append(f"parameters identical on {identical.group(1)} ranks, not {ranks}")
    digests = sorted({entry.get("digest", "") for entry in (summary or {}).get("ranks", [])})
    if summary is None:
        problems.append("no summary.json")
    elif summary.get("world_size") != ranks or len(summary.get("ranks", [])) != ranks:
        problems.append(f"summary.json holds {len(summary.get('ranks', []))} rank(s), not {ranks}")
    elif len(digests) != 1:
        problems.append(f"summary.json holds {len(digests)} different parameter digests")
    elif identical and not digests[0].startswith(identical.group(2)):
        problems.append("summary.json's digest is not the one the trainer printed")
    nccl = nccl_evidence(output, ranks)
    if ranks > 1 and not nccl.ok:
        problems.append(f"the gradients' allreduce: {nccl.text}")
    if problems:
        return Verdict(False, "; ".join(problems))
    return Verdict(
        True,
        f"{ranks} rank(s) on cuda, {TRAINER_EPOCHS} epochs of digits, validation accuracy {accuracy:.3f}, parameters "
        f"identical on all {ranks} ranks (sha256 {digests[0][:12]}..., summary.json agrees)"
        + (f"; gradients averaged by {nccl.text}" if ranks > 1 else "; 1 rank: no gradient allreduce"),
    )


# --- the launch ---------------------------------------------------------------------------------------------------
def mpirun_argv(ranks: int, env_names: list[str], root: bool) -> list[str]:
    """mpirun's words for `ranks` ranks in this container, passing `env_names` on to them."""
    argv = ["mpirun", "-np", str(ranks), "-bind-to", "none", "-map-by", "slot"]
    if root:
        argv.insert(1, "--allow-run-as-root")
    for name in env_names:
        argv += ["-x", name]
    return argv


def run_echoing(argv: list[str], env: dict[str, str], seconds: float) -> tuple[int | None, str]:
    """Runs argv, echoing its output as it comes; (exit status or None when it ran past `seconds`, the output)."""
    print("+ " + " ".join(argv), flush=True)
    process = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    lines: list[str] = []

    def echo() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            print(line, end="", flush=True)

    reader = threading.Thread(target=echo, daemon=True)
    reader.start()
    try:
        rc: int | None = process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.terminate()  # mpirun passes SIGTERM on to the ranks
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
        rc = None
    reader.join(timeout=10)
    return rc, "".join(lines)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_metrics(path: Path) -> list[dict]:
    """The trainer's metrics records (app/metrics.py); none where it wrote none or wrote them wrong."""
    try:
        return read_records(path)
    except (OSError, ValueError):
        return []


def run_step(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "NCCL_DEBUG": "INFO", "PYTHONUNBUFFERED": "1"}
    names = [name for name in ("NCCL_DEBUG", "PYTHONUNBUFFERED", "PYTHONPATH") if name in env]
    started = time.monotonic()
    if args.step == "allreduce":
        timeline, values = out / "allreduce-timeline.json", out / "allreduce-values.json"
        for stale in (timeline, values):
            stale.unlink(missing_ok=True)
        env["HOROVOD_TIMELINE"] = str(timeline)
        command = [sys.executable, str(Path(__file__).resolve()), "rank", "--json", str(values)]
        argv = mpirun_argv(args.ranks, [*names, "HOROVOD_TIMELINE"], os.geteuid() == 0) + command
        rc, output = run_echoing(argv, env, args.timeout)
        timeline_text = timeline.read_text(errors="replace") if timeline.exists() else None
        verdict = judge_allreduce(rc, args.timeout, output, read_json(values), timeline_text, args.ranks)
    else:
        metrics, summary = out / "metrics.jsonl", out / "summary.json"
        for stale in (metrics, summary):
            stale.unlink(missing_ok=True)
        env[GPUS_ASKED] = "1"  # a rank without CUDA stops in one line instead of training on the CPU
        command = [sys.executable, "-m", "app.train", "--dataset", "digits", "--epochs", str(TRAINER_EPOCHS)]
        command += ["--progress", "lines", "--run-dir", "/tmp/gpu-check-train"]
        command += ["--metrics-file", str(metrics), "--summary-file", str(summary)]  # curves.png lands beside them
        argv = mpirun_argv(args.ranks, [*names, GPUS_ASKED], os.geteuid() == 0) + command
        rc, output = run_echoing(argv, env, args.timeout)
        verdict = judge_trainer(rc, args.timeout, output, read_summary(out), read_metrics(metrics), args.ranks)
    took = f" ({time.monotonic() - started:.0f} s)"
    print(f"{args.step}-check: {'PASS' if verdict.ok else 'FAIL'} {verdict.text}{took}", flush=True)
    return 0 if verdict.ok else 1


# --- one rank (TensorFlow) ----------------------------------------------------------------------------------------
def run_rank(args: argparse.Namespace) -> int:
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    hvd.init()
    rank, size, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
    gpus = tf.config.list_physical_devices("GPU")
    problems: list[str] = []
    if local_rank < len(gpus):  # one GPU per rank, as the trainer pins it (NCCL refuses two ranks on one GPU)
        tf.config.experimental.set_memory_growth(gpus[local_rank], True)
        tf.config.set_visible_devices(gpus[local_rank], "GPU")
    else:
        tf.config.set_visible_devices([], "GPU")
        problems.append(f"rank {rank}: TensorFlow sees {len(gpus)} GPU(s), none for local rank {local_rank}")
    # Every rank learns whether every rank has a GPU before any GPU collective (a CPU tensor: MPI carries it).
    with tf.device("/CPU:0"):
        ready = hvd.allreduce(tf.constant([0.0 if problems else 1.0]), op=hvd.Min, name="ready")
    figures: dict = {"ranks": size, "sizes": args.sizes, "nccl_built": int(hvd.nccl_built())}
    if float(ready.numpy()[0]) == 1.0:
        figures["device_name"] = tf.config.experimental.get_device_details(gpus[local_rank]).get("device_name", "GPU")
        problems += check_values(hvd, tf, np, rank, size, [int(n) for n in args.sizes.split(",") if n], figures)
    else:
        problems.append("not every rank has a GPU: no GPU allreduce was tried")
    with tf.device("/CPU:0"):
        every = hvd.allgather_object(problems, name="problems")
    hvd.shutdown()  # writes the rest of the timeline
    if rank == 0:
        found = sorted({problem for rank_problems in every for problem in rank_problems})
        Path(args.json).write_text(json.dumps({**figures, "problems": found}, indent=2))
        print(f"rank 0: {json.dumps({**figures, 'problems': found})}", flush=True)
    return 0


def check_values(hvd, tf, np, rank: int, size: int, sizes: list[int], figures: dict) -> list[str]:
    """Sums and averages of GPU tensors checked element by element; the time of the largest (figures)."""
    problems = []
    total = size * (size + 1) // 2
    for n in sizes:
        with tf.device("/GPU:0"):
            pattern = tf.cast(tf.range(n) % 97 + 1, tf.float32)  # 1..97, never zero, exact in float32
            mine = pattern * float(rank + 1)
            summed = hvd.allreduce(mine, op=hvd.Sum, name=f"sum.{n}")
            averaged = hvd.allreduce(mine, op=hvd.Average, name=f"avg.{n}")
        for tensor, what in ((mine, "input"), (summed, "sum")):
            if "GPU" not in tensor.device:
                problems.append(f"the {what} of {n} floats is on {tensor.device}, not a GPU")
        expected = pattern.numpy() * total
        wrong = int(np.count_nonzero(summed.numpy() != expected))
        if wrong:
            problems.append(f"sum of {n} floats: {wrong} element(s) wrong (expected {total} x pattern)")
        if not np.allclose(averaged.numpy(), expected / size, rtol=1e-6, atol=0):
            problems.append(f"average of {n} floats: wrong (expected {total / size} x pattern)")
    # The largest allreduce's time after a warm-up; bus bandwidth as nccl-tests counts it, 2 (N - 1) / N.
    n = max(sizes)
    with tf.device("/GPU:0"):
        ones = tf.ones([n], tf.float32)
        times = []
        for attempt in range(13):
            started = time.perf_counter()
            float(hvd.allreduce(ones, op=hvd.Sum, name="timed")[0])  # reading one element waits for the GPU
            if attempt >= 3:
                times.append(time.perf_counter() - started)
    seconds = statistics.median(times)
    megabytes = n * 4 / 1e6
    algbw = megabytes / 1e3 / seconds
    figures.update(largest_mb=megabytes, allreduce_ms=seconds * 1e3, busbw_gb_s=algbw * 2 * (size - 1) / size)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    for step in ("allreduce", "trainer"):
        sub = steps.add_parser(step)
        sub.add_argument("--ranks", type=int, required=True, help="one per GPU")
        sub.add_argument("--out", default="/out", help="where the step's files go (default: %(default)s)")
        sub.add_argument("--timeout", type=float, default=300, help="seconds for mpirun (default: %(default)s)")
    rank = steps.add_parser("rank")
    rank.add_argument("--json", required=True, help="rank 0 writes its figures and problems here")
    rank.add_argument("--sizes", default=ALLREDUCE_SIZES, help="float32 elements per tensor, comma-separated")
    args = parser.parse_args(argv)
    return run_rank(args) if args.step == "rank" else run_step(args)


if __name__ == "__main__":
    sys.exit(main())
