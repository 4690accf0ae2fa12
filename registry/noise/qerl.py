"""QeRL's adaptive quantization noise schedule (AQN; Huang et al. 2025, arXiv 2510.11696, Eq. 8).

The run's max_steps are cut into K = num_stages equal intervals; weight step s is in stage
k = floor(s * K / max_steps) (grpokit.noise.stage_of). Stage 0 adds no noise (the paper's first
interval runs on the quantization noise alone), and stages k = 1 .. K-1 decay geometrically from
sigma_start to sigma_end, both ends included:

    sigma(0) = 0,    sigma(k) = sigma_start * (sigma_end / sigma_start) ** ((k - 1) / (K - 2))

With the defaults (5e-2 -> 5e-4, K = 10, the paper's range) stage 1 is 5e-2, stage 9 is 5e-4 and each
stage is 10 ** (-2/8) ~= 0.562 times the one before. This is the mapping of QeRL's own scheduler (K - 1
geometric values after one noise-free interval); the paper's Eq. 8 writes the same decay counting only
the noisy stages (k = 1 .. K with K - 1 in the exponent). K = 2 gives sigma_start for the second half.

Departures: the noise is drawn once per weight push (each step's weights get fresh noise, as in QeRL's
code), not per forward pass as the paper's text puts it; and grpokit's engines serve an unquantized
base, so stage 0 has no noise at all rather than NVFP4's quantization noise.
"""

from __future__ import annotations

from grpokit.noise import NoiseScheduler, noisy_stage_progress


class QeRL(NoiseScheduler):
    """Geometric decay from sigma_start to sigma_end over num_stages intervals, the first noise-free (QeRL AQN)."""

    def __init__(
        self, enabled: bool = True, sigma_start: float = 5e-2, sigma_end: float = 5e-4, num_stages: int = 10
    ) -> None:
        """
        Args:
            enabled: false turns the noise off (sigma 0 at every step).
            sigma_start: sigma of the first noisy stage (stage 1).
            sigma_end: sigma of the last stage (stage num_stages - 1).
            num_stages: equal intervals of trainer.max_steps; stage 0 is noise-free.
        """
        if num_stages < 2:
            raise ValueError(
                f"model.noise_scheduler.init_args.num_stages must be >= 2 (stage 0 is noise-free), got {num_stages}"
            )
        if sigma_start <= 0 or sigma_end <= 0:
            raise ValueError(
                "model.noise_scheduler.init_args.sigma_start and sigma_end must be > 0 for a "
                f"geometric decay, got {sigma_start}, {sigma_end}; use LinearNoise to decay to 0"
            )
        self.enabled, self.sigma_start, self.sigma_end, self.num_stages = enabled, sigma_start, sigma_end, num_stages

    def sigma(self, step: int, max_steps: int) -> float:
        progress = noisy_stage_progress(step, max_steps, self.num_stages)
        if not self.enabled or progress is None:
            return 0.0
        return self.sigma_start * (self.sigma_end / self.sigma_start) ** progress
