"""Length-weighted group-mean baseline, OPO's optimal reward baseline (Hao et al. 2025, "On-Policy RL
with Optimal Reward Baseline", arXiv 2505.23585; verl's `opo` advantage estimator):

    b = sum_j len_j r_j / sum_j len_j        A_i = r_i - b

over the G rollouts of one prompt, len_j = sum_t m_jt the number of rollout j's trained tokens
(completion_mask m_jt = 1, the tokens the policy wrote; Advantage.token_advantages passes these counts).
A multi-turn rollout's tool results and user turns are in its completion but not in len_j, as in verl's
`opo`, whose response length is the sum of the response mask; a single-turn rollout's len_j is its
completion length. The variance-minimising
baseline is E[|grad log pi(y)|^2 r] / E[|grad log pi(y)|^2]; OPO assumes the squared gradient norm grows
in proportion to the length, which leaves this weighted mean; only trained tokens have a gradient, so
only they count. It is also the baseline that fits token-level loss aggregation: every trained token of
rollout i carries A_i, and sum_i len_i A_i = 0, so a group's advantages cancel over its trained tokens
rather than over its rollouts. A rollout masked out of the loss (non-finite engine logprobs) has no
trained tokens and so no weight.

Departures: if a group's lengths are all 0 there is nothing to weight by and the baseline falls back to
the plain mean (grpokit's choice; OPO does not cover it). A single-rollout group gets 0 (a flat group,
per the Advantage contract), where verl's `opo` uses baseline 0 and passes the raw reward through.
"""

from __future__ import annotations

import torch

from grpokit.advantage import Advantage, zero_flat_groups


class LengthWeightedMean(Advantage):
    """r - the group's mean reward weighted by trained (policy-written) tokens (OPO's baseline)."""

    def __call__(self, rewards_PG: torch.Tensor, lengths_PG: torch.Tensor) -> torch.Tensor:
        weights_PG = lengths_PG.to(rewards_PG.dtype)
        has_tokens_P1 = weights_PG.sum(-1, keepdim=True) > 0
        weights_PG = torch.where(has_tokens_P1, weights_PG, torch.ones_like(weights_PG))
        baseline_P1 = (weights_PG * rewards_PG).sum(-1, keepdim=True) / weights_PG.sum(-1, keepdim=True)
        return zero_flat_groups(rewards_PG - baseline_P1, rewards_PG)
