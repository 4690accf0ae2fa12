"""The learning-rate schedule of model.lr_schedule: linear warm-up, then constant or cosine decay."""

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
