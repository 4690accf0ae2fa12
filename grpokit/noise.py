"""The `noise` kind: QeRL-style noise on the inference copy's RMSNorm weights, sigma per step.

Contract: `scheduler.sigma(step, max_steps) -> float`, a pure function of the weight step (no state),
0 for no noise; `step` counts the optimizer steps the weights have seen (0 .. max_steps). The trainer's
weights are never noised: at each weight push, grpokit.common.noisy_norms adds N(0, sigma^2) to a copy of the
clean norm weights and the broadcast carries that copy to the engine. `enabled: false` turns a
scheduler off without removing it from the recipe (sigma is then 0 at every step).
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class NoiseScheduler(ABC):
    """Maps a training step to the noise standard deviation for the engine's norm weights."""

    enabled: bool = True

    @abstractmethod
    def sigma(self, step: int, max_steps: int) -> float:
        """Return sigma for the weights of `step` in a run of `max_steps` steps."""


def stage_of(step: int, max_steps: int, num_stages: int) -> int:
    """The stage of `step` when max_steps is cut into num_stages equal intervals: floor(step * K / max_steps),
    clamped to K - 1 (the weights published after the last step belong to the last stage)."""
    return min(max(step, 0) * num_stages // max(max_steps, 1), num_stages - 1)


def noisy_stage_progress(step: int, max_steps: int, num_stages: int) -> float | None:
    """Where `step` lies among the noisy stages 1..K-1: None in the noise-free stage 0, else
    (k - 1) / (K - 2) in [0, 1] (0 when K = 2). Staged schedules decay sigma along this fraction."""
    k = stage_of(step, max_steps, num_stages)
    if k == 0:
        return None
    return 0.0 if num_stages == 2 else (k - 1) / (num_stages - 2)
