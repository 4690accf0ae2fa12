"""Linear noise decay over QeRL's stages (the paper's linear baseline in its scheduler comparison, Fig. 9):

    sigma(0) = 0,    sigma(k) = sigma_start + (sigma_end - sigma_start) * (k - 1) / (K - 2),   k = 1 .. K-1

with K = num_stages equal intervals of max_steps and stage k = floor(step * K / max_steps), as in QeRL.
"""

from __future__ import annotations

from grpokit.noise import NoiseScheduler, noisy_stage_progress


class LinearNoise(NoiseScheduler):
    """Linear decay from sigma_start to sigma_end over num_stages intervals, the first noise-free."""

    def __init__(
        self, enabled: bool = True, sigma_start: float = 5e-2, sigma_end: float = 5e-4, num_stages: int = 10
    ) -> None:
        """
        Args:
            enabled: false turns the noise off (sigma 0 at every step).
            sigma_start: sigma of the first noisy stage (stage 1).
            sigma_end: sigma of the last stage (stage num_stages - 1); 0 is allowed.
            num_stages: equal intervals of trainer.max_steps; stage 0 is noise-free.
        """
        if num_stages < 2:
            raise ValueError(
                f"model.noise_scheduler.init_args.num_stages must be >= 2 (stage 0 is noise-free), got {num_stages}"
            )
        if sigma_start < 0 or sigma_end < 0:
            raise ValueError(
                "model.noise_scheduler.init_args.sigma_start and "
                f"sigma_end must be >= 0, got {sigma_start}, {sigma_end}"
            )
        self.enabled, self.sigma_start, self.sigma_end, self.num_stages = enabled, sigma_start, sigma_end, num_stages

    def sigma(self, step: int, max_steps: int) -> float:
        progress = noisy_stage_progress(step, max_steps, self.num_stages)
        if not self.enabled or progress is None:
            return 0.0
        return self.sigma_start + (self.sigma_end - self.sigma_start) * progress
