"""Learning-rate schedule: linear scaling by world size, reached through a linear warm-up.

Scaling the rate with the global batch keeps large-batch training on track, but starting at the scaled rate
diverges early on; warming up over the first epochs avoids that (Goyal et al., 2017).
"""

from __future__ import annotations


def scaled_lr(base_lr: float, world_size: int, use_adasum: bool) -> float:
    """The rate after warm-up. Adasum combines gradients adaptively rather than averaging, so its rate is
    not multiplied by the world size."""
    return base_lr if use_adasum else base_lr * world_size


def learning_rate(step: int, steps_per_epoch: int, base_lr: float, target_lr: float, warmup_epochs: float) -> float:
    """Rate for global optimizer step `step` (0-based): linear from base_lr to target_lr over warmup_epochs."""
    return rate_at(step / steps_per_epoch, base_lr, target_lr, warmup_epochs)


def rate_at(epochs_done: float, base_lr: float, target_lr: float, warmup_epochs: float) -> float:
    """Rate after `epochs_done` epochs of training (fractional). Elastic training counts progress in samples,
    since the number of steps per epoch changes with the world size."""
    if warmup_epochs <= 0 or epochs_done >= warmup_epochs:
        return target_lr
    return base_lr + (target_lr - base_lr) * (epochs_done / warmup_epochs)
