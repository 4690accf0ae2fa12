"""Per-step sampling temperature: linear or cosine from start_temperature to end_temperature."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from grpokit.inference import MIN_TEMPERATURE


@dataclass
class TemperatureSchedule:
    """Sampling temperature as a function of the step (the batch records it; the trainer uses it).

    Args:
        type: linear or cosine interpolation over the run's max_steps.
        start_temperature: temperature at step 0.
        end_temperature: temperature at the last step.
    """

    type: Literal["linear", "cosine"] = "linear"
    start_temperature: float = 1.0
    end_temperature: float = 0.7

    def __post_init__(self) -> None:
        ends = (self.start_temperature, self.end_temperature)
        if not all(math.isfinite(t) and t >= MIN_TEMPERATURE for t in ends):
            raise ValueError(
                f"data.temp_scheduler temperatures must be finite numbers >= {MIN_TEMPERATURE:g} (a smaller one "
                f"overflows the logits), got {self.start_temperature}, {self.end_temperature}"
            )

    def at(self, step: int, max_steps: int) -> float:
        progress = min(1.0, step / max(1, max_steps - 1))
        if self.type == "cosine":
            progress = 0.5 * (1 - math.cos(math.pi * progress))
        return self.start_temperature + (self.end_temperature - self.start_temperature) * progress
