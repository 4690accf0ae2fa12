"""The `noise` kind: QeRL-style noise on the inference copy's RMSNorm weights, sigma per step.

Contract: `scheduler.sigma(step, max_steps) -> float`, a pure function of the step (no state), 0 for
no noise. The trainer's weights are never noised; the engine adds N(0, sigma^2) to clean norm weights.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class NoiseScheduler(ABC):
    """Maps a training step to the noise standard deviation for the engine's norm weights."""

    @abstractmethod
    def sigma(self, step: int, max_steps: int) -> float:
        """Return sigma for `step` of a run of `max_steps` steps."""
