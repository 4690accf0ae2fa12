"""GRPO's group-normalised advantage (Shao et al. 2024, DeepSeekMath):

    A_i = (r_i - mean_g r) / (std r + eps)

over the G rollouts of one prompt, where `scale` picks the std:
- "group" (GRPO): the std of the prompt's own G rewards.
- "batch": the std of all P*G rewards of the step, so an easy or hard prompt (small group std) is not
  blown up to unit scale; group-level mean with batch-level std is what Liu et al. 2025 ("Part I: Tricks
  or Traps? A Deep Dive into RL for LLM Reasoning", arXiv 2508.08221) recommend, and TRL's
  `scale_rewards="batch"`. This is the std of the raw rewards; REINFORCE++ divides by the std of the
  group-centred rewards instead (see ReinforcePP).
- "none": no division, which is Dr. GRPO's advantage (also available as DrGRPO).

Every std is the population standard deviation (divide by the number of rewards), so a group of two
rollouts with rewards {0, 1} gets advantages {-1, +1} (up to eps); papers differ here and the sample std
would scale every "group" advantage by sqrt((G-1)/G). Departure: a group whose rewards are all equal gets
exactly 0, not the rounding residue divided by eps.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

from grpokit.advantage import Advantage, zero_flat_groups

Scale = Literal["group", "batch", "none"]


class GroupNorm(Advantage):
    """(r - group mean) / (group std + eps): GRPO's default advantage; batch std or none by `scale`."""

    def __init__(self, eps: float = 1e-6, scale: Scale = "group") -> None:
        """
        Args:
            eps: added to the std so a zero std gives 0, not NaN.
            scale: divide by the group's reward std ("group"), by the std of every reward in the batch
                ("batch"), or not at all ("none").
        """
        if scale not in get_args(Scale):
            raise ValueError(f"GroupNorm scale must be one of {get_args(Scale)}, got {scale!r}")
        self.eps = eps
        self.scale = scale

    def __call__(self, rewards_PG: torch.Tensor, lengths_PG: torch.Tensor) -> torch.Tensor:
        advantages_PG = rewards_PG - rewards_PG.mean(-1, keepdim=True)
        if self.scale == "group":
            advantages_PG = advantages_PG / (rewards_PG.std(-1, keepdim=True, correction=0) + self.eps)
        elif self.scale == "batch":
            advantages_PG = advantages_PG / (rewards_PG.std(correction=0) + self.eps)
        return zero_flat_groups(advantages_PG, rewards_PG)
