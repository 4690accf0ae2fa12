"""Constant noise: the same sigma at every step, from the first (no noise-free stage, no decay).

The ablation against QeRL's schedule: does the decay matter, or only that there is noise?
"""

from __future__ import annotations

from grpokit.noise import NoiseScheduler


class ConstantNoise(NoiseScheduler):
    """The same sigma for the weights of every step."""

    def __init__(self, enabled: bool = True, sigma: float = 1e-2) -> None:
        """
        Args:
            enabled: false turns the noise off (sigma 0 at every step).
            sigma: standard deviation of the noise added to each norm weight.
        """
        if sigma < 0:
            raise ValueError(f"model.noise_scheduler.init_args.sigma must be >= 0, got {sigma}")
        self.enabled, self.sigma_value = enabled, sigma

    def sigma(self, step: int, max_steps: int) -> float:
        return self.sigma_value if self.enabled else 0.0
