"""`python -m app.bench peers`: Horovod (MPI ops, Gloo ops) beside torch DDP (Gloo), same model, batch, threads
and ranks, synthetic data; Horovod both with its own settings and with the stack's defaults (HOROVOD_DEFAULTS).

Each configuration is one job: warm-up steps, then timed steps (zero_grad, forward, backward, optimizer step);
a step's time is the slowest rank's. Configurations run round-robin, `--repeats` rounds, so every round measures
all of them under the same machine load; a row gives the median over rounds and the spread (min-max), and
the ratio to DDP is taken within each round before its median is taken.

Scaling efficiency, throughput(N) / (N x throughput(1)), measures each configuration against the limit: every
round also trains the model in one plain process (no DDP, no Horovod, same threads and batch), and a row's
efficiency is its throughput over N times that, per round, then the median. 1.00 is perfect scaling; on this
machine's 2 cores the N ranks also share the cores that the one process had to itself, so the limit is lower.

    python -m app.bench peers [--models simplenet resnet18] [--ranks 2] [--repeats 3] [--out bench-out]
    python -m app.bench peers --variant c5=hvd-gloo:HOROVOD_CYCLE_TIME=5   (extra configurations, e.g. to tune)
"""

from __future__ import annotations

import argparse
import statistics
import time

from app.bench import ranks as launch
from app.bench.report import median_spread, write_report
from app.horovod_defaults import HOROVOD_DEFAULTS

MODELS = {"simplenet": (1, 28, 28), "resnet18": (3, 32, 32)}
STEPS = {"simplenet": (20, 200), "resnet18": (3, 15)}
"""Warm-up and timed steps per model: a few seconds each on one core."""
ALONE = "1 process"
"""The label of the one plain process (no DDP, no Horovod) that scaling efficiency is measured against."""


def default_variants() -> list[tuple[str, str, dict[str, str]]]:
    """(label, peer, env): DDP, then each Horovod peer untuned and with the stack's defaults, and Gloo with the
    stack's defaults but Horovod's own cycle loop (the idle wait of docker/patch-horovod-source.sh turned off)."""
    stack = dict(HOROVOD_DEFAULTS)
    return [
        ("ddp", "ddp", {}),
        ("hvd-mpi untuned", "hvd-mpi", {}),
        ("hvd-mpi stack", "hvd-mpi", stack),
        ("hvd-gloo untuned", "hvd-gloo", {}),
        ("hvd-gloo stack", "hvd-gloo", stack),
        ("hvd-gloo no idle wait", "hvd-gloo", {**stack, "HOROVOD_STACK_IDLE_WAIT_MS": "0"}),
    ]


def parse_variant(text: str) -> tuple[str, str, dict[str, str]]:
    """'LABEL=PEER[:K=V,K=V]' -> (label, peer, env)."""
    label, _, rest = text.partition("=")
    peer, _, assignments = rest.partition(":")
    if not label or peer not in launch.PEERS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL=PEER[:K=V,...], PEER one of {launch.PEERS}")
    env = dict(item.split("=", 1) for item in assignments.split(",") if item)
    return label, peer, env


# --- rank side ------------------------------------------------------------------------------------------------
def build_model(name: str):
    if name == "simplenet":
        from app.model import SimpleNet

        return SimpleNet()
    import torchvision

    return torchvision.models.resnet18(num_classes=10)


def timed_steps(name: str, model, optimizer, batch: int, warmup: int, steps: int, device) -> tuple[list[float], float]:
    """Trains `model` (MODELS[name]'s input) on one synthetic batch: `warmup` steps, then `steps` timed ones (zero_grad,
    forward, backward, optimizer step). Returns each timed step's seconds and this process's CPU seconds per step."""
    import torch
    import torch.nn.functional as F

    images = torch.randn(batch, *MODELS[name], device=device)
    labels = torch.randint(0, 10, (batch,), device=device)
    timings, cpu_started = [], 0.0
    for index in range(warmup + steps):
        if index == warmup:
            cpu_started = time.process_time()  # all of this process's threads: compute, Horovod's, the transport's
        started = time.perf_counter()
        optimizer.zero_grad()
        output = model(images)
        loss = F.nll_loss(output, labels) if name == "simplenet" else F.cross_entropy(output, labels)
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        timings.append(time.perf_counter() - started)
    return timings[warmup:], (time.process_time() - cpu_started) / steps


def rank_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--model", choices=MODELS, default="simplenet")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--alone", action="store_true", help="one plain process: no DDP or Horovod wrapping")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    peer = launch.Peer(args.peer, args.device)
    torch.manual_seed(0)
    model = build_model(args.model).to(peer.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if args.alone:  # the scaling baseline: the model alone, no wrapping
        pass
    elif args.peer == "ddp":
        device_ids = [peer.device] if args.device == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    else:
        import horovod.torch as hvd

        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    timings, cpu_per_step = timed_steps(args.model, model, optimizer, args.batch, args.warmup, args.steps, peer.device)
    per_rank = peer.gather((timings, cpu_per_step))
    per_step = [max(steps) for steps in zip(*(steps for steps, _ in per_rank), strict=False)]
    step = statistics.median(per_step)
    peer.finish(
        args.result,
        {
            "step_s": step,
            "samples_per_sec": peer.size * args.batch / step,
            "cpu_s_per_step": statistics.mean(cpu for _, cpu in per_rank),
            "gradient_mb": sum(p.numel() for p in model.parameters()) * 4 / 1e6,
        },
    )


# --- driver ---------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m app.bench peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: one GPU per rank, DDP over NCCL, Horovod's NCCL ops (needs the GPU build)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="rounds over all configurations")
    parser.add_argument("--steps-scale", type=float, default=1.0, help="multiplies each model's step counts")
    parser.add_argument(
        "--variant",
        type=parse_variant,
        action="append",
        default=[],
        help="LABEL=PEER[:K=V,...], an extra configuration (DDP is always the reference)",
    )
    parser.add_argument("--only-variants", action="store_true", help="run DDP and the --variant ones only")
    parser.add_argument("--short", action="store_true", help="CI: SimpleNet, one round, a few steps")
    parser.add_argument("--out", default="bench-out")
    args = parser.parse_args(argv)
    if args.short:
        args.models, args.repeats, args.steps_scale = ["simplenet"], 1, 0.05
    variants = ([default_variants()[0]] if args.only_variants else default_variants()) + args.variant
    if args.short:  # the stack's own configurations only
        variants = [variant for variant in variants if "untuned" not in variant[0]]

    results: dict[tuple[str, str], list[dict]] = {}
    for round_ in range(args.repeats):
        for model in args.models:
            warmup, steps = (max(1, round(n * args.steps_scale)) for n in STEPS[model])
            job_args = ["--model", model, "--batch", str(args.batch), "--threads", str(args.threads)]
            job_args += ["--device", args.device, "--warmup", str(warmup), "--steps", str(steps)]
            alone = launch.run_job("ddp", 1, "peers", [*job_args, "--alone"])
            results.setdefault((model, ALONE), []).append(alone)
            print(
                f"[peers] round {round_ + 1}/{args.repeats} {model:<9} {ALONE:<18} "
                f"{alone['samples_per_sec']:8.0f} samples/s",
                flush=True,
            )
            for label, peer, env in variants:
                job = launch.run_job(peer, args.ranks, "peers", job_args, env)
                results.setdefault((model, label), []).append(job)
                print(
                    f"[peers] round {round_ + 1}/{args.repeats} {model:<9} {label:<18} "
                    f"{job['samples_per_sec']:8.0f} samples/s",
                    flush=True,
                )
    rows = peer_rows(results, args.models, [v[0] for v in variants], args.ranks)
    columns = [
        ("model", "model", ""),
        ("config", "config", ""),
        ("samples_per_sec", "samples/s", ".0f"),
        ("samples_min", "min", ".0f"),
        ("samples_max", "max", ".0f"),
        ("step_ms", "step ms", ".2f"),
        ("cpu_ms_per_step", "CPU ms/step", ".2f"),
        ("ratio_to_ddp", "/ DDP", ".2f"),
        ("ratio_min", "min", ".2f"),
        ("ratio_max", "max", ".2f"),
        ("scaling_efficiency", "scaling eff.", ".2f"),
        ("efficiency_min", "min", ".2f"),
        ("efficiency_max", "max", ".2f"),
    ]
    env_text = ", ".join(f"{k}={v}" for k, v in HOROVOD_DEFAULTS.items())
    title = (
        f"Horovod vs torch DDP ({'NCCL, GPU' if args.device == 'cuda' else 'CPU'}): {args.ranks} ranks x "
        f"{args.threads} thread(s), batch {args.batch}, "
        f"median of {args.repeats} round(s)"
    )
    write_report(
        args.out,
        "peers",
        title,
        columns,
        rows,
        draw=lambda fig: draw(fig, rows, args.models),
        extra={
            "ranks": args.ranks,
            "batch": args.batch,
            "threads": args.threads,
            "device": args.device,
            "repeats": args.repeats,
            "stack_defaults": HOROVOD_DEFAULTS,
        },
        notes=[
            f"stack = the stack's defaults ({env_text}); untuned = Horovod 0.28.1's own settings (the stack's "
            "build: docker/patch-horovod-source.sh); no idle wait = HOROVOD_STACK_IDLE_WAIT_MS=0; "
            "min/max: spread over rounds; CPU ms/step: CPU time of one rank's process (all its "
            "threads) per step; scaling eff.: throughput / (ranks x the one plain process's throughput), "
            f"per round, then the median ({ALONE}: the one process itself)."
        ],
    )
    return {"rows": rows}


def peer_rows(
    results: dict[tuple[str, str], list[dict]], models: list[str], labels: list[str], ranks: int
) -> list[dict]:
    """One row per (model, configuration), the one plain process first: throughput median/min/max over rounds,
    and, taken in each round, then median/min/max: the ratio to DDP (labels[0]) and the scaling efficiency,
    throughput / (ranks x the one process's). The one process's own row has neither."""
    rows = []
    for model in models:
        reference = [job["samples_per_sec"] for job in results[(model, labels[0])]]
        alone = [job["samples_per_sec"] for job in results[(model, ALONE)]]
        for label in [ALONE, *labels]:
            jobs = results[(model, label)]
            rates = [job["samples_per_sec"] for job in jobs]
            rate, low, high = median_spread(rates)
            if label == ALONE:
                ratio = ratio_low = ratio_high = efficiency = efficiency_low = efficiency_high = None
            else:
                ratio, ratio_low, ratio_high = median_spread([r / ref for r, ref in zip(rates, reference, strict=True)])
                efficiency, efficiency_low, efficiency_high = median_spread(
                    [r / (ranks * one) for r, one in zip(rates, alone, strict=True)]
                )
            rows.append(
                {
                    "model": model,
                    "config": label,
                    "samples_per_sec": rate,
                    "samples_min": low,
                    "samples_max": high,
                    "step_ms": statistics.median(j["step_s"] for j in jobs) * 1e3,
                    "cpu_ms_per_step": statistics.median(j["cpu_s_per_step"] for j in jobs) * 1e3,
                    "ratio_to_ddp": ratio,
                    "ratio_min": ratio_low,
                    "ratio_max": ratio_high,
                    "scaling_efficiency": efficiency,
                    "efficiency_min": efficiency_low,
                    "efficiency_max": efficiency_high,
                }
            )
    return rows


def draw(figure, rows: list[dict], models: list[str]) -> None:
    """Ratio to DDP per configuration, one group of bars per model, spread as error bars."""
    rows = [row for row in rows if row["ratio_to_ddp"] is not None]
    axes = figure.add_subplot()
    labels = list(dict.fromkeys(row["config"] for row in rows))
    width = 0.8 / max(1, len(models))
    for index, model in enumerate(models):
        model_rows = [row for row in rows if row["model"] == model]
        positions = [i + index * width for i in range(len(model_rows))]
        heights = [row["ratio_to_ddp"] for row in model_rows]
        errors = [
            [h - row["ratio_min"] for h, row in zip(heights, model_rows, strict=True)],
            [row["ratio_max"] - h for h, row in zip(heights, model_rows, strict=True)],
        ]
        axes.bar(positions, heights, width, yerr=errors, capsize=3, label=model)
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xticks([i + width * (len(models) - 1) / 2 for i in range(len(labels))], labels, fontsize=8)
    axes.set_ylabel("throughput / DDP")
    axes.legend()
