"""The `advantage` kind: turns a step's rewards into per-rollout advantages.

Shape legend: P prompts (groups), G rollouts per prompt.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class Advantage(ABC):
    """Contract: `advantage(rewards_PG, lengths_PG) -> advantages_PG`.

    Rows are groups of rollouts of the same prompt. Pure tensor function: no state, same dtype and shape
    out as in, finite for finite input (a group whose rewards are all equal gets advantage 0).
    """

    @abstractmethod
    def __call__(self, rewards_PG: torch.Tensor, lengths_PG: torch.Tensor) -> torch.Tensor:
        """Return the advantage of each rollout (shape P x G)."""
