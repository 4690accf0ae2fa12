"""Dr. GRPO's advantage (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective",
arXiv 2503.20783):

    A_i = r_i - mean_g r

over the G rollouts of one prompt. Dropping GRPO's division by the group std removes its question-level
difficulty bias: prompts the policy almost always (or almost never) solves have a small std and would
otherwise get the largest advantages. Same numbers as GroupNorm(scale="none").

Departure: Dr. GRPO also replaces GRPO's per-sequence length normalisation of the loss with a constant;
that half belongs to the loss (kind `loss`), not to this class.
"""

from __future__ import annotations

import torch

from grpokit.advantage import Advantage, zero_flat_groups


class DrGRPO(Advantage):
    """r - group mean, without GRPO's division by the group std."""

    def __call__(self, rewards_PG: torch.Tensor, lengths_PG: torch.Tensor) -> torch.Tensor:
        return zero_flat_groups(rewards_PG - rewards_PG.mean(-1, keepdim=True), rewards_PG)
