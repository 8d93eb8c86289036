"""`launcher doctor --links`, its pure part: which pairs, over which addresses, what a probe's output means, the
matrix, the slowest link, and the prediction for one gradient exchange on it.

Pairs are unordered (node order: the earlier node probes the later one), and each pair is measured both ways on
one connection (launcher/agent/linkprobe.py): every ordered pair gets its own rate, since a link can be slower one way
(shaping, a duplex mismatch, a busy NIC), and the ring sends one way round while receiving from the other side.
The round trip is one figure per pair.

The prediction is the cost model that app.bench ps-vs-ring measures against (bandwidth term only; one home:
app/cost_model.py, stdlib-only, so the launcher needs no torch), with N = the job's ranks and B = the slowest link's
rate. With ranks placed node by node, as mpirun's hostfile places them, a flat ring over N ranks crosses each node's NIC
once each way, so every NIC carries 2(N-1)/N·M per allreduce, as in the one-rank-per-host model; for the parameter
server (rank 0 serving, the other N-1 ranks pushing through its link) ranks that share rank 0's node make the figure an
upper bound.

The advice holds the predicted ring allreduce against the compute of one step (`advice`): a step's exchange that
takes longer than its compute sets the pace however well Horovod overlaps it with the backward pass, and fp16
compression halves it; one far below the compute costs nothing to leave as it is. `python -m app.bench links`
measures both sides of that on shaped links (docs/performance.md).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from app.cost_model import model_seconds
from launcher.core.nics import own_nic, subnet_of

Addresses = list[tuple[str, str]] | tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Link:
    """One pair, measured both ways on one connection."""

    source: str
    """The node that probed (the earlier one)."""
    target: str
    """The node whose server it reached."""
    address: str
    """The target's address the probe connected to."""
    rtt_ms: float
    forward_mbit: float
    """source -> target"""
    backward_mbit: float
    """target -> source"""


@dataclass(frozen=True)
class Unreachable:
    source: str
    target: str
    address: str
    port: int
    why: str


@dataclass(frozen=True)
class Prediction:
    gradient_mb: float
    ranks: int
    source: str
    target: str
    link_mbit: float
    rtt_ms: float
    ring_s: float
    ps_s: float


Item = TypeVar("Item")


def pairs(nodes: Sequence[Item]) -> list[tuple[Item, Item]]:
    """Every unordered pair once, in node order: (prober, server)."""
    return [(a, b) for index, a in enumerate(nodes) for b in nodes[index + 1 :]]


def job_address(addresses: Addresses, network_interface: str | None) -> str | None:
    """A node's IPv4 address on the job's NIC: its address in the subnet, or on the named NIC; None where no NIC is
    pinned (the node is then reached by its name, as the hostfile names it) or it has no such address."""
    if not network_interface:
        return None
    subnet = subnet_of(network_interface)
    nic = own_nic(network_interface, addresses)
    for name, address in addresses:
        ip = ipaddress.ip_interface(address).ip
        if name == nic and (not subnet or ip in ipaddress.ip_network(subnet)):
            return str(ip)
    return None


def last_json(output: str) -> dict:
    """The probe's result: the last line of its output that is a JSON object ({} if none)."""
    for line in reversed(output.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def read_probe(source: str, target: str, target_address: str, port: int, output: str) -> Link | Unreachable:
    """A probe container's output as a Link, or what stopped it."""
    result = last_json(output)
    if "forward" in result and "backward" in result:
        return Link(
            source,
            target,
            result.get("address", target_address),
            float(result["rtt_ms"]),
            float(result["forward"]["mbit"]),
            float(result["backward"]["mbit"]),
        )
    tail = output.strip().splitlines()[-1][:200] if output.strip() else "no output"
    return Unreachable(source, target, target_address, port, str(result.get("error", tail)))


def unreachable_line(failure: Unreachable) -> str:
    """One line naming both nodes and the fix."""
    return (
        f"{failure.source} cannot reach {failure.target} at {failure.address}:{failure.port} ({failure.why}); allow "
        f"TCP from {failure.source} to {failure.target} on the job's NIC (the workers' sshd port and the ports Open "
        "MPI, NCCL and Gloo open), or pin a NIC both reach with --network-interface"
    )


def directed(links: list[Link]) -> dict[tuple[str, str], float]:
    """Mbit/s for each ordered pair (from, to)."""
    rates = {}
    for link in links:
        rates[(link.source, link.target)] = link.forward_mbit
        rates[(link.target, link.source)] = link.backward_mbit
    return rates


def round_trips(links: list[Link]) -> dict[tuple[str, str], float]:
    """RTT ms for each ordered pair (the same both ways)."""
    rtt = {}
    for link in links:
        rtt[(link.source, link.target)] = rtt[(link.target, link.source)] = link.rtt_ms
    return rtt


def slowest(links: list[Link]) -> tuple[str, str, float, float]:
    """(from, to, Mbit/s, RTT ms) of the slowest direction of any pair (ties: the first in node order)."""
    (source, target), mbit = min(directed(links).items(), key=lambda item: item[1])
    return source, target, mbit, round_trips(links)[(source, target)]


def rate_unit(rates: list[float]) -> tuple[str, float]:
    """Gbit/s where every rate is at least 1 Gbit/s, else Mbit/s: (unit, divisor from Mbit/s)."""
    return ("Gbit/s", 1000.0) if rates and min(rates) >= 1000 else ("Mbit/s", 1.0)


def format_matrix(nodes: list[str] | tuple[str, ...], links: list[Link]) -> list[str]:
    """Two matrices, from the row's node to the column's: the rate each way, and the round trip."""
    rates, rtt = directed(links), round_trips(links)
    unit, divisor = rate_unit(list(rates.values()))
    width = max(10, *(len(node) + 2 for node in nodes))

    def table(title: str, cell) -> list[str]:
        lines = [title.ljust(width) + "".join(node.rjust(width) for node in nodes)]
        for row in nodes:
            cells = ("-" if row == column else cell((row, column)) for column in nodes)
            lines.append(row.ljust(width) + "".join(value.rjust(width) for value in cells))
        return lines

    def rate_cell(pair: tuple[str, str]) -> str:
        return f"{rates[pair] / divisor:.{2 if divisor > 1 else 1}f}" if pair in rates else "?"

    def rtt_cell(pair: tuple[str, str]) -> str:
        return f"{rtt[pair]:.3f}" if pair in rtt else "?"

    return [*table(unit, rate_cell), *table("RTT ms", rtt_cell)]


def predict(links: list[Link], gradient_mb: float, ranks: int) -> Prediction:
    """One ring allreduce and one parameter-server exchange of `gradient_mb` over `ranks` ranks on the slowest
    link, by app.bench ps-vs-ring's cost model."""
    source, target, mbit, rtt_ms = slowest(links)
    return Prediction(
        gradient_mb,
        ranks,
        source,
        target,
        mbit,
        rtt_ms,
        ring_s=model_seconds("ring", ranks, gradient_mb, mbit),
        ps_s=model_seconds("ps", ranks, gradient_mb, mbit),
    )


def milliseconds(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.1f} ms" if ms >= 10 else f"{ms:.3f} ms"


def prediction_lines(prediction: Prediction, gradient_name: str) -> list[str]:
    unit, divisor = rate_unit([prediction.link_mbit])
    lines = [
        f"gradient: {prediction.gradient_mb:g} MB ({gradient_name}); N = {prediction.ranks} ranks",
        f"slowest link: {prediction.source} -> {prediction.target}, {prediction.link_mbit / divisor:.2f} {unit}, "
        f"RTT {prediction.rtt_ms:.3f} ms",
        f"predicted ring allreduce: {milliseconds(prediction.ring_s)} (2(N-1)M/(NB)); parameter-server exchange: "
        f"{milliseconds(prediction.ps_s)} (2(N-1)M/B); app.bench ps-vs-ring's cost model, bandwidth term",
    ]
    if prediction.ring_s < prediction.rtt_ms / 1e3:
        lines.append(
            f"note: below the link's round trip ({prediction.rtt_ms:.3f} ms): for a gradient this small latency, "
            "not bandwidth, sets the exchange time"
        )
    return lines


BALANCED = 0.25
"""An exchange below this share of the compute is left as it is (compute-bound); from it up to the compute it shows
in the step (partly hidden by the backward pass); above the compute it sets the pace (communication-bound)."""
FP16 = "fp16 compression halves the exchange (--fp16-allreduce / hvd.Compression.fp16)"


def duration(seconds: float) -> str:
    """0.37 s from 0.1 s up, else milliseconds."""
    return f"{seconds:.2f} s" if seconds >= 0.1 else milliseconds(seconds)


def advice(exchange_s: float, compute_s: float, compute_source: str) -> str:
    """One line: the predicted exchange against the compute per step (measured where `compute_source` says), and
    what to do about it."""
    ratio = exchange_s / compute_s
    head = (
        f"exchange {duration(exchange_s)} vs compute {duration(compute_s)} per step ({compute_source}) on the "
        "slowest link"
    )
    if ratio >= 1:
        more = (
            "; halved it still exceeds the compute: a faster link, or more compute per exchange (a larger batch "
            "per rank)"
            if ratio >= 2
            else ""
        )
        return f"{head}: communication-bound; {FP16}{more}"
    if ratio >= BALANCED:
        return (
            f"{head}: the exchange is {ratio:.0%} of the compute, partly hidden behind the backward pass; {FP16}, if "
            "the step time matters"
        )
    return f"{head}: compute-bound: nothing to gain from compression or tuning"
