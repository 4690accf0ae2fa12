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


def zero_flat_groups(advantages_PG: torch.Tensor, rewards_PG: torch.Tensor) -> torch.Tensor:
    """`advantages_PG` with every group whose rewards are all equal set to exactly 0.

    The Advantage contract promises 0 there, and arithmetic alone does not deliver it: r - mean(r) over
    three rewards of 0.1 leaves 1.4e-17, which a std division with eps = 0 turns into -1 (or 0/0 = NaN
    when the rounding happens to cancel).
    """
    flat_P1 = (rewards_PG == rewards_PG[..., :1]).all(-1, keepdim=True)
    return advantages_PG.masked_fill(flat_P1, 0.0)
