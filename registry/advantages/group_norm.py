"""GRPO's group-normalised advantage (Shao et al. 2024, DeepSeekMath):

    A_i = (r_i - mean_g r) / (std_g r + eps)

over the G rollouts of one prompt. std is the population standard deviation (divide by G), so a group
of two rollouts with rewards {0, 1} gets advantages {-1, +1} (up to eps); papers differ here and the
sample std would scale every advantage by sqrt((G-1)/G).
"""

from __future__ import annotations

import torch

from grpokit.advantage import Advantage


class GroupNorm(Advantage):
    """(r - group mean) / (group std + eps): GRPO's default advantage."""

    def __init__(self, eps: float = 1e-6) -> None:
        """
        Args:
            eps: added to the group std so equal-reward groups give 0, not NaN.
        """
        self.eps = eps

    def __call__(self, rewards_PG: torch.Tensor, lengths_PG: torch.Tensor) -> torch.Tensor:
        mean_P1 = rewards_PG.mean(-1, keepdim=True)
        std_P1 = rewards_PG.std(-1, keepdim=True, correction=0)
        return (rewards_PG - mean_P1) / (std_P1 + self.eps)
