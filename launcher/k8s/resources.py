"""A pod's CPU and memory as Kubernetes takes them: quantities (`500m`, `2`, `8Gi`), and `--cpu`/`--memory` values
`REQUEST[:LIMIT]`. Pure.

Requests without limits make a pod Burstable (scheduled by its requests, evicted after BestEffort pods, counted by a
ResourceQuota on requests); a limit as well is what a quota on limits asks for. GPUs are extended resources, limits
only (Kubernetes makes the request equal), and are not this module's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

QUANTITY = re.compile(r"(?P<number>\d+(?:\.\d*)?|\.\d+)(?P<unit>[KMGTPE]i|[mkMGTPE])?")
"""Kubernetes' quantity grammar without signs and exponents (resource.Quantity), e.g. 500m, 0.5, 2, 512Mi, 8G."""
UNITS: dict[str | None, Decimal] = {
    None: Decimal(1),
    "m": Decimal("0.001"),
    **{unit: Decimal(1000) ** power for power, unit in enumerate("kMGTPE", 1)},
    **{f"{unit}i": Decimal(1024) ** power for power, unit in enumerate("KMGTPE", 1)},
}
EXAMPLES = {"cpu": "--cpu 4 or --cpu 4:8 (cores; 500m is half a core)", "memory": "--memory 16Gi or --memory 16Gi:32Gi"}


def quantity_value(text: str) -> Decimal | None:
    """The quantity's value in its base unit (cores, bytes); None if Kubernetes would not read it."""
    found = QUANTITY.fullmatch(text)
    if not found:
        return None
    return Decimal(found.group("number")) * UNITS[found.group("unit")]


@dataclass(frozen=True)
class Amount:
    """One resource's request and, where given, its limit."""

    request: str
    limit: str | None = None


def parse_amount(text: str, resource: str) -> Amount:
    """`REQUEST[:LIMIT]` for `resource` (cpu or memory); ValueError naming the fix."""
    request, _, limit = text.partition(":")
    flag = f"--{resource}"
    for part in (request, limit) if limit else (request,):
        value = quantity_value(part)
        if value is None or value <= 0:
            raise ValueError(
                f"{flag} {text!r}: {part!r} is not a positive Kubernetes quantity; pass e.g. {EXAMPLES[resource]}"
            )
    if limit and (quantity_value(limit) or 0) < (quantity_value(request) or 0):
        raise ValueError(f"{flag} {text!r}: the limit {limit} is below the request {request}; pass a larger limit")
    if resource == "memory" and quantity_value(request) < 1024**2:  # type: ignore[operator]
        raise ValueError(
            f"{flag} {text!r} is under 1Mi: a memory quantity is in bytes unless it has a unit (Mi, Gi); "
            f"pass e.g. {EXAMPLES[resource]}"
        )
    return Amount(request, limit or None)


def times(quantity: str, factor: int) -> str:
    """A quantity `factor` times over, in its own unit (`2Gi` x 4 -> `8Gi`)."""
    found = QUANTITY.fullmatch(quantity)
    assert found, quantity
    number = Decimal(found.group("number")) * factor
    return f"{number.normalize():f}{found.group('unit') or ''}"


def resources(cpu: Amount, memory: Amount, extra_limits: dict[str, int] | None = None) -> dict[str, dict]:
    """A container's `resources`: the requests, and the limits given (with any extended resources, e.g. GPUs)."""
    limits: dict[str, str | int] = {
        name: amount.limit for name, amount in (("cpu", cpu), ("memory", memory)) if amount.limit
    }
    limits.update(extra_limits or {})
    made: dict[str, dict] = {"requests": {"cpu": cpu.request, "memory": memory.request}}
    if limits:
        made["limits"] = limits
    return made
