"""Leave-one-out baseline (RLOO; Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
Optimization for Learning from Human Feedback in LLMs", arXiv 2402.14740; the estimator is Kool et al.
2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!"):

    A_i = r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean_g r)

over the G >= 2 rollouts of one prompt. The baseline of rollout i does not depend on r_i, so the
gradient estimate stays unbiased, and a group's advantages sum to 0.

Departure: RLOO as published subtracts a KL penalty from the reward before the baseline; grpokit passes
rewards through as scored (a KL term, if any, belongs to the loss).
"""

from __future__ import annotations

import torch

from grpokit.advantage import Advantage, zero_flat_groups


class LeaveOneOut(Advantage):
    """Each rollout's baseline is the mean reward of the other rollouts of its prompt."""

    def __call__(self, rewards_PG: torch.Tensor, lengths_PG: torch.Tensor) -> torch.Tensor:
        g = rewards_PG.shape[-1]
        if g < 2:
            raise ValueError(f"LeaveOneOut needs at least 2 rollouts per prompt (data.rollouts_per_example), got {g}")
        baseline_PG = (rewards_PG.sum(-1, keepdim=True) - rewards_PG) / (g - 1)
        return zero_flat_groups(rewards_PG - baseline_PG, rewards_PG)
