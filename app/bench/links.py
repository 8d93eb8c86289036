"""`python -m app.bench links`: Horovod's levers for slow links (fp16 compression, Adasum, the tensor fusion threshold,
the cycle time) measured side by side on 2 ranks, each in its own network namespace with a link rate-limited by tc
(app.bench.netns, as ps-vs-ring), one rate after another on the same namespaces.

    python -m app.bench links --rates 1gbit 200mbit --models simplenet resnet18 [--json FILE]   (root, ip, tc)

Per rate and model, one job per setting (SETTINGS), Horovod over Open MPI's TCP transport on the shaped NICs, as
the stack's fixed-size jobs run: warm-up steps, then timed steps (synthetic batch, SGD); a step's time is the slower
rank's. Beside them, one plain process trains the model alone (no Horovod): its step time is the compute a step
costs here. Each row also has:

- predicted exchange: the ring model (app/cost_model.py, one home with `launcher doctor --links` and ps-vs-ring) for
  the gradient's bytes on the wire (half of them with fp16) at the link's rate;
- measured exchange: the same gradients allreduced alone, with the setting's compression, op, fusion and cycle,
  timed (the slower rank; median of a few): what the prediction is held against;
- exposed exchange: step time minus the plain process's compute, the part of the exchange that the backward pass did
  not hide.

Configurations run in rounds (--repeats): each round runs every setting under the same machine load, starting one
setting further on than the last, after one discarded job per rate; samples/s is the median over rounds with its
min-max, and the ratio to fp32 is taken within each round before its median.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from app.bench import netns
from app.bench import ranks as launch
from app.bench.peers import MODELS, build_model, timed_steps
from app.bench.report import median_spread, write_report
from app.cost_model import model_seconds
from app.horovod_defaults import HOROVOD_DEFAULTS

RANKS = 2


@dataclass(frozen=True)
class Setting:
    """One way to run the exchange: fp16 compression, Adasum instead of averaging, Horovod variables."""

    fp16: bool = False
    adasum: bool = False
    env: dict[str, str] = field(default_factory=dict)

    @property
    def wire_fraction(self) -> float:
        """The share of the fp32 gradient's bytes that cross the link."""
        return 0.5 if self.fp16 else 1.0


MB = 1024 * 1024
SETTINGS: dict[str, Setting] = {
    "fp32": Setting(),
    "fp16": Setting(fp16=True),
    "adasum": Setting(adasum=True),
    "fusion-0": Setting(env={"HOROVOD_FUSION_THRESHOLD": "0"}),
    "fusion-64mb": Setting(env={"HOROVOD_FUSION_THRESHOLD": str(64 * MB)}),
    "cycle-5ms": Setting(env={"HOROVOD_CYCLE_TIME": "5"}),
    "cycle-25ms": Setting(env={"HOROVOD_CYCLE_TIME": "25"}),
    "mpi-rd": Setting(
        env={"OMPI_MCA_coll_tuned_use_dynamic_rules": "1", "OMPI_MCA_coll_tuned_allreduce_algorithm": "3"}
    ),
}
"""fp32 is Horovod's own settings (fusion threshold 128 MB, cycle 1 ms) with the stack's defaults and Open MPI's own
choice of allreduce algorithm; the others change one thing each (mpi-rd: Open MPI's recursive doubling, which on 2
ranks sends each rank's whole buffer both ways at once)."""
STEPS = {"simplenet": (5, 30), "resnet18": (2, 4)}
"""Warm-up and timed steps per model."""
EXCHANGES = {"simplenet": 5, "resnet18": 3}
"""Timed exchanges of the whole gradient per job (after one untimed)."""
UNITS = {"kbit": 1e-3, "mbit": 1.0, "gbit": 1e3}
QUEUE = "32mb"


def parse_rate(text: str) -> float:
    """'200mbit', '1gbit', '500kbit' or a bare number of Mbit/s -> Mbit/s."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(kbit|mbit|gbit)?\s*", text.lower())
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a link rate: e.g. 200mbit or 1gbit")
    return float(match.group(1)) * UNITS[match.group(2) or "mbit"]


def rate_label(mbit: float) -> str:
    """Mbit/s as tc would say it: 1gbit, 200mbit."""
    return f"{mbit / 1e3:g}gbit" if mbit >= 1e3 and (mbit / 1e3).is_integer() else f"{mbit:g}mbit"


def predicted_exchange_s(gradient_mb: float, setting: str, link_mbit: float, ranks: int = RANKS) -> float:
    """The ring model's seconds for one exchange of the gradient's bytes on the wire under `setting`."""
    return model_seconds("ring", ranks, gradient_mb * SETTINGS[setting].wire_fraction, link_mbit)


# --- rank side ------------------------------------------------------------------------------------------------
def rank_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--setting", choices=SETTINGS, required=True)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--exchanges", type=int, required=True)
    args = parser.parse_args(argv)

    import horovod.torch as hvd
    import torch

    torch.set_num_threads(1)
    peer = launch.Peer(args.peer)
    torch.manual_seed(0)
    setting = SETTINGS[args.setting]
    model = build_model(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    compression = hvd.Compression.fp16 if setting.fp16 else hvd.Compression.none
    op = hvd.Adasum if setting.adasum else hvd.Average
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression, op=op
    )
    timings, _ = timed_steps(args.model, model, optimizer, args.batch, args.warmup, args.steps, peer.device)
    exchanges = exchange_seconds(model, compression, op, args.exchanges)
    per_rank = peer.gather((timings, exchanges))
    per_step = [max(steps) for steps in zip(*(steps for steps, _ in per_rank), strict=True)]
    per_exchange = [max(times) for times in zip(*(times for _, times in per_rank), strict=True)]
    step = statistics.median(per_step)
    peer.finish(
        args.result,
        {
            "step_s": step,
            "samples_per_sec": peer.size * args.batch / step,
            "exchange_s": statistics.median(per_exchange),
            "gradient_mb": sum(p.numel() for p in model.parameters()) * 4 / 1e6,
        },
    )


def exchange_seconds(model, compression, op, repeats: int) -> list[float]:
    """The model's gradients allreduced alone as DistributedOptimizer sends them (one async allreduce per tensor,
    compressed, fused by Horovod's background thread), `repeats` times after one untimed; each starts after a
    barrier."""
    import horovod.torch as hvd

    times = []
    for index in range(repeats + 1):
        hvd.barrier()
        started = time.perf_counter()
        handles = []
        for name, parameter in model.named_parameters():
            tensor, _ = compression.compress(parameter.grad)
            handles.append(hvd.allreduce_async(tensor, name=f"exchange.{name}", op=op))
        for handle in handles:
            hvd.synchronize(handle)
        if index:
            times.append(time.perf_counter() - started)
    return times


# --- driver ---------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m app.bench links", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=parse_rate, nargs="+", default=[1000.0, 200.0], help="e.g. 1gbit 200mbit")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    parser.add_argument("--batch", type=int, default=64, help="per rank")
    parser.add_argument("--repeats", type=int, default=1, help="rounds over all settings, per rate")
    parser.add_argument("--steps-scale", type=float, default=1.0, help="multiplies each model's step counts")
    parser.add_argument("--queue", default=QUEUE, help=f"each link's queue, as tc's tbf limit (default {QUEUE})")
    parser.add_argument("--json", type=Path, help="also write the rows here, a JSON list of objects")
    parser.add_argument("--short", action="store_true", help="CI: SimpleNet at 20 Mbit/s, fp32 and fp16, few steps")
    parser.add_argument("--out", default="bench-out")
    args = parser.parse_args(argv)
    if args.short:
        args.rates, args.models, args.settings, args.steps_scale = [20.0], ["simplenet"], ["fp32", "fp16"], 0.3
    if "fp32" not in args.settings:
        args.settings.insert(0, "fp32")  # the reference every ratio is taken against
    if reason := netns.unavailable():
        raise SystemExit(f"links {reason}")

    results: dict[tuple[float, str, str], list[dict]] = {}
    with netns.Network(RANKS, args.rates[0], names=netns.LINKS, queue=args.queue) as network:
        for rate in args.rates:
            network.shape(rate)
            if not args.short:
                warm_up(args.models[-1], args)
            for round_ in range(args.repeats):
                for model in args.models:
                    for setting, job in measure_round(model, args, rate, round_):
                        results.setdefault((rate, model, setting), []).append(job)
                        print(
                            f"[links] {rate_label(rate)} round {round_ + 1}/{args.repeats} {model:<9} {setting:<12} "
                            f"step {job['step_s'] * 1e3:8.1f} ms"
                            + (f", exchange {job['exchange_s'] * 1e3:8.1f} ms" if "exchange_s" in job else ""),
                            flush=True,
                        )
    rows = link_rows(results)
    write_report(
        args.out,
        "links",
        f"Horovod on shaped links: {RANKS} ranks, one namespace each, batch {args.batch} per rank, median of "
        f"{args.repeats} round(s)",
        COLUMNS,
        rows,
        draw=lambda figure: draw(figure, rows, args.models),
        extra={"ranks": RANKS, "batch": args.batch, "repeats": args.repeats, "stack_defaults": HOROVOD_DEFAULTS},
        notes=NOTES,
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return {"rows": rows}


COMPUTE = "compute"
"""The plain process's label in results: the model trained alone, no Horovod."""


def rotated(settings: list[str], round_: int) -> list[str]:
    """The settings in round `round_`'s order: each round starts one further on, so no setting is always first
    (in the first runs fp32, always first, came out slower than fusion-64mb, which differs from it in nothing that
    matters for these models)."""
    shift = round_ % len(settings) if settings else 0
    return settings[shift:] + settings[:shift]


def horovod_job(model: str, setting: str, args, warmup: int, steps: int, exchanges: int) -> dict:
    """One 2-rank Horovod job over the shaped links."""
    common = ["--model", model, "--batch", str(args.batch), "--warmup", str(warmup), "--steps", str(steps)]
    return launch.run_job(
        "hvd-mpi",
        RANKS,
        "links",
        [*common, "--setting", setting, "--exchanges", str(exchanges)],
        {**HOROVOD_DEFAULTS, **SETTINGS[setting].env, **netns.mpi_env(netns.LINKS)},
        mpi_args=netns.MPI_OVER_NIC,
        mpi_rank_wrapper=netns.mpi_rank_wrapper(netns.LINKS),
    )


def warm_up(model: str, args) -> None:
    """One short job at each new rate, not recorded: the links, Open MPI and the page cache warmed up alike for
    every setting measured after it."""
    horovod_job(model, "fp32", args, 1, 1, 1)


def measure_round(model: str, args, rate: float, round_: int = 0) -> Iterator[tuple[str, dict]]:
    """One round at one rate: the plain process, then every setting (rotated), back to back (each as it ends)."""
    warmup, steps = (max(1, round(n * args.steps_scale)) for n in STEPS[model])
    common = ["--model", model, "--batch", str(args.batch), "--warmup", str(warmup), "--steps", str(steps)]
    yield COMPUTE, launch.run_job("ddp", 1, "peers", [*common, "--threads", "1", "--alone"])
    exchanges = max(1, round(EXCHANGES[model] * min(1.0, args.steps_scale * 2)))
    for setting in rotated(args.settings, round_):
        yield setting, horovod_job(model, setting, args, warmup, steps, exchanges)


def link_rows(results: dict[tuple[float, str, str], list[dict]]) -> list[dict]:
    """One row per (rate, model, setting), in the order measured: samples/s (median and min-max over rounds), step
    time, the plain process's compute, the exposed exchange (step - compute), the predicted and the measured exchange
    and the prediction's error, and the ratio to fp32 (taken within each round, then the median)."""
    rows = []
    for (rate, model, setting), jobs in results.items():
        if setting == COMPUTE:
            continue
        compute = statistics.median(job["step_s"] for job in results[(rate, model, COMPUTE)])
        reference = [job["samples_per_sec"] for job in results[(rate, model, "fp32")]]
        rates = [job["samples_per_sec"] for job in jobs]
        samples, low, high = median_spread(rates)
        step = statistics.median(job["step_s"] for job in jobs)
        predicted = predicted_exchange_s(jobs[0]["gradient_mb"], setting, rate)
        measured = statistics.median(job["exchange_s"] for job in jobs)
        rows.append(
            {
                "rate": rate_label(rate),
                "rate_mbit": rate,
                "model": model,
                "setting": setting,
                "samples_per_s": samples,
                "samples_min": low,
                "samples_max": high,
                "vs_fp32": statistics.median(r / ref for r, ref in zip(rates, reference, strict=True)),
                "step_s": step,
                "compute_s": compute,
                "exposed_exchange_s": step - compute,
                "predicted_exchange_s": predicted,
                "measured_exchange_s": measured,
                "prediction_error": predicted / measured - 1,
                "gradient_mb": jobs[0]["gradient_mb"],
            }
        )
    return rows


COLUMNS = [
    ("rate", "link", ""),
    ("model", "model", ""),
    ("setting", "setting", ""),
    ("samples_per_s", "samples/s", ".0f"),
    ("samples_min", "min", ".0f"),
    ("samples_max", "max", ".0f"),
    ("vs_fp32", "/ fp32", ".2f"),
    ("step_s", "step s", ".3f"),
    ("compute_s", "compute s", ".3f"),
    ("exposed_exchange_s", "exposed s", ".3f"),
    ("predicted_exchange_s", "predicted exch. s", ".3f"),
    ("measured_exchange_s", "measured exch. s", ".3f"),
    ("prediction_error", "pred. error", "+.0%"),
]
NOTES = [
    "fp32: Horovod's own fusion threshold (128 MB) and cycle time (1 ms) with the stack's defaults; each other setting "
    "changes one thing (fp16: hvd.Compression.fp16; adasum: op=hvd.Adasum; fusion-N: HOROVOD_FUSION_THRESHOLD; "
    "cycle-N: HOROVOD_CYCLE_TIME; mpi-rd: Open MPI's recursive-doubling allreduce). compute s: the model trained "
    "alone in one plain process; exposed s: step - compute; "
    "predicted exch.: the ring model 2(N-1)M/(NB) for the bytes on the wire (fp16: half); measured exch.: the "
    "gradients allreduced alone with the setting (median); pred. error: predicted / measured - 1; min/max: spread over "
    "rounds."
]


def draw(figure, rows: list[dict], models: list[str]) -> None:
    """samples/s against the link's rate, one panel per model, one line per setting."""
    panels = figure.subplots(1, len(models), squeeze=False)[0]
    for axes, model in zip(panels, models, strict=True):
        model_rows = [row for row in rows if row["model"] == model]
        for setting in dict.fromkeys(row["setting"] for row in model_rows):
            points = sorted((row["rate_mbit"], row["samples_per_s"]) for row in model_rows if row["setting"] == setting)
            axes.plot([x for x, _ in points], [y for _, y in points], marker="o", label=setting)
        axes.set_xscale("log")
        axes.set_xlabel("link Mbit/s")
        axes.set_ylabel("samples/s")
        axes.set_title(model, fontsize=9)
        axes.legend(fontsize=7)
