"""REINFORCE++ (Hu 2025, arXiv 2501.03262): global advantage normalisation over the whole batch.

    A_i  = r_i - mean_g r                                (skipped when subtract_group_mean is False)
    A'_i = (A_i - mean_batch A) / (std_batch A + eps)

mean_batch and std_batch run over all P*G rollouts of the step (population std). With the group mean
subtracted this is the paper's "REINFORCE++ w/ baseline" for reasoning tasks: the std is that of the
group-centred rewards, not of the raw rewards (GroupNorm(scale="batch") uses the raw ones). Without it
the baseline is the batch mean, as in REINFORCE++ proper.

Departures:
- Reference implementations (OpenRLHF, verl's `masked_whiten`) whiten over response tokens, so a long
  completion weighs more in mean_batch and std_batch; here each rollout counts once.
- REINFORCE++ folds a token-level KL penalty into the reward; grpokit passes rewards through as scored.
- With subtract_group_mean=False a group whose rewards are all equal gets a nonzero advantage when the
  rest of the batch differs (that is the algorithm: the baseline is the batch, not the group); the
  Advantage contract's zero then holds only when the whole batch is equal.
"""

from __future__ import annotations

import torch

from grpokit.advantage import Advantage, zero_flat_groups


class ReinforcePP(Advantage):
    """REINFORCE++: group-mean baseline, then mean/std normalisation over the whole batch."""

    def __init__(self, subtract_group_mean: bool = True, eps: float = 1e-6) -> None:
        """
        Args:
            subtract_group_mean: subtract each prompt's mean reward first (REINFORCE++-baseline); off,
                the batch mean is the only baseline.
            eps: added to the batch std so a zero std gives 0, not NaN.
        """
        self.subtract_group_mean = subtract_group_mean
        self.eps = eps

    def __call__(self, rewards_PG: torch.Tensor, lengths_PG: torch.Tensor) -> torch.Tensor:
        centered_PG = rewards_PG - rewards_PG.mean(-1, keepdim=True) if self.subtract_group_mean else rewards_PG
        advantages_PG = (centered_PG - centered_PG.mean()) / (centered_PG.std(correction=0) + self.eps)
        if self.subtract_group_mean:
            return zero_flat_groups(advantages_PG, rewards_PG)
        # the baseline group is the whole batch: only an all-equal batch is flat
        return zero_flat_groups(advantages_PG.reshape(1, -1), rewards_PG.reshape(1, -1)).reshape(rewards_PG.shape)
