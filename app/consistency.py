"""Checks that every rank ends with the same model: a digest of the parameters per rank, compared."""

from __future__ import annotations

import hashlib

import torch
from torch import nn


def parameter_digest(model: nn.Module) -> str:
    """SHA-256 over the exact bytes of every parameter and buffer, in state_dict order."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def ranks_differing_from_root(digests: list[str], root_rank: int = 0) -> list[int]:
    """Ranks whose digest differs from the root rank's (empty when all agree)."""
    return [rank for rank, digest in enumerate(digests) if digest != digests[root_rank]]
