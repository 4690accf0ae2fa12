"""The learning-rate schedule of model.lr_schedule: linear warm-up, then constant or cosine decay; and the
start-up checks of the optimizer's numbers."""

from __future__ import annotations

import math


def lr_factor(step: int, warmup_steps: int, max_steps: int, schedule: str, min_ratio: float) -> float:
    """Multiplier of the peak lr at `step`: linear warm-up, then constant or cosine to min_ratio."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def check_optimizer_settings(
    lr: float, weight_decay: float, betas: tuple[float, float], warmup_steps: int, min_lr_ratio: float,
    max_grad_norm: float,
) -> None:  # fmt: skip
    """The optimizer's and schedule's recipe values, refused at start with the key and the rule: a negative
    lr trains uphill and a negative clip norm or warm-up would be taken silently."""
    rules = [
        ("model.lr", lr, math.isfinite(lr) and lr > 0, "> 0"),
        ("model.weight_decay", weight_decay, math.isfinite(weight_decay) and weight_decay >= 0, ">= 0"),
        ("model.betas", list(betas), all(0 <= b < 1 for b in betas), "in [0, 1)"),
        ("model.warmup_steps", warmup_steps, warmup_steps >= 0, ">= 0"),
        ("model.min_lr_ratio", min_lr_ratio, 0 <= min_lr_ratio <= 1, "in [0, 1]"),
        ("model.max_grad_norm", max_grad_norm, max_grad_norm >= 0, ">= 0 (0 disables clipping)"),
    ]
    for key, value, ok, rule in rules:
        if not ok:
            raise ValueError(f"{key} must be {rule}, got {value}")
