"""Process-supervised advantage (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, section 4.1.3
"Process Supervision RL with GRPO"; PRIME, Cui et al. 2025, arXiv 2502.01456, assigns credit to its
implicit process rewards the same way, as a return with discount 1):

With rollout i of a group reporting step rewards r_i^1 .. r_i^K_i, step k ending at completion token
end_i^k, and R the step rewards of every rollout of the group:

    r~_i^k  = (r_i^k - mean(R)) / (std(R) + eps)
    A_{i,t} = sum_{k : end_i^k >= t} r~_i^k

so a token's advantage is the normalised reward of its own step plus that of every later step; tokens
after a rollout's last step end get 0. Environments report steps through a task method
`step_rewards(reply)` (grpokit.environments.environment); the orchestrator maps their character ends to tokens.

Departures: std is the population std (as GroupNorm), and a group whose step rewards are all equal (or
that has none) gets exactly 0. The outcome reward is not used, as in DeepSeekMath's process
supervision (an environment that wants it folds it into the last step's reward); PRIME mixes it in
with an RLOO baseline. Called as a plain `advantage(rewards_PG, lengths_PG)` each rollout is one step
ending at its last token, rewarded with its outcome reward, which is GRPO's group-normalised advantage.

Shape legend: P prompts, G rollouts per prompt, N = P * G rollouts, K steps, C completion tokens.
"""

from __future__ import annotations

import torch

from grpokit.advantage import Advantage
from grpokit.types import Rollout


class Process(Advantage):
    """Step rewards normalised over the group; a token's advantage sums its own and later steps'."""

    uses_outcome_reward = False  # token_advantages reads step rewards only (data.kl_in_reward refuses it)

    def __init__(self, eps: float = 1e-6) -> None:
        """
        Args:
            eps: added to the std of the group's step rewards so a zero std gives 0, not NaN.
        """
        self.eps = eps

    def __call__(self, rewards_PG: torch.Tensor, lengths_PG: torch.Tensor) -> torch.Tensor:
        return normalized_steps(
            rewards_PG[..., None], torch.ones_like(rewards_PG[..., None], dtype=torch.bool), self.eps
        )[..., 0]

    def token_advantages(self, groups: list[list[Rollout]]) -> list[list[float]]:
        rollouts = [r for g in groups for r in g]
        for r in rollouts:
            if r.step_rewards is None:
                raise ValueError(
                    f"Process (data.advantage) needs step rewards, and environment {r.env_id!r} "
                    "reports none: give its task a step_rewards(reply) method returning (end "
                    "character, reward) per step (see grpokit/environments/environment.py), "
                    "or choose another data.advantage"
                )
        if not rollouts:
            return []
        rewards_NK, ends_NK, mask_NK = padded_steps(rollouts)
        shape = (len(groups), len(groups[0]), rewards_NK.shape[-1])
        num_tokens = max(len(r.completion_ids) for r in rollouts)
        advantages_PGC = process_advantages(
            rewards_NK.view(shape), ends_NK.view(shape), mask_NK.view(shape), num_tokens, self.eps
        )
        return [a_C[: len(r.completion_ids)].tolist() for a_C, r in zip(advantages_PGC.flatten(0, 1), rollouts)]


def padded_steps(rollouts: list[Rollout]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step rewards, step ends and a validity mask, padded to the most steps of any rollout (N x K)."""
    k = max(1, max(len(r.step_rewards) for r in rollouts))
    rewards_NK = torch.zeros(len(rollouts), k, dtype=torch.float64)
    ends_NK = torch.zeros(len(rollouts), k, dtype=torch.long)
    for i, r in enumerate(rollouts):
        rewards_NK[i, : len(r.step_rewards)] = torch.tensor(r.step_rewards, dtype=torch.float64)
        ends_NK[i, : len(r.step_ends)] = torch.tensor(r.step_ends, dtype=torch.long)
    mask_NK = torch.arange(k) < torch.tensor([len(r.step_rewards) for r in rollouts])[:, None]
    return rewards_NK, ends_NK, mask_NK


def normalized_steps(rewards_PGK: torch.Tensor, mask_PGK: torch.Tensor, eps: float) -> torch.Tensor:
    """(r - mean) / (std + eps) over each group's valid steps (mask); 0 off the mask and in flat groups."""
    n_P11 = mask_PGK.sum((1, 2), keepdim=True).clamp(min=1)
    mean_P11 = torch.where(mask_PGK, rewards_PGK, 0.0).sum((1, 2), keepdim=True) / n_P11
    var_P11 = torch.where(mask_PGK, (rewards_PGK - mean_P11) ** 2, 0.0).sum((1, 2), keepdim=True) / n_P11
    normalized_PGK = (rewards_PGK - mean_P11) / (var_P11.sqrt() + eps)
    # flat: no two valid step rewards differ (also true when there are none); exactly 0 there, see zero_flat_groups
    highest_P11 = torch.where(mask_PGK, rewards_PGK, -torch.inf).amax((1, 2), keepdim=True)
    lowest_P11 = torch.where(mask_PGK, rewards_PGK, torch.inf).amin((1, 2), keepdim=True)
    return torch.where(mask_PGK & (highest_P11 > lowest_P11), normalized_PGK, 0.0)


def process_advantages(
    rewards_PGK: torch.Tensor, ends_PGK: torch.Tensor, mask_PGK: torch.Tensor, num_tokens: int, eps: float
) -> torch.Tensor:
    """A_{i,t} = sum of the normalised rewards of rollout i's steps ending at or after token t (shape P x G x C).

    Each normalised reward is added at its step's end token, then a reverse cumulative sum over tokens
    gives every token the sum over ends >= t: O(P G C) memory, not O(P G K C).
    """
    normalized_PGK = normalized_steps(rewards_PGK, mask_PGK, eps)
    at_end_PGC = torch.zeros(*rewards_PGK.shape[:2], num_tokens, dtype=rewards_PGK.dtype)
    if num_tokens == 0:  # every completion is empty, so no rollout has a step
        return at_end_PGC
    at_end_PGC.scatter_add_(2, ends_PGK, normalized_PGK)  # padded steps add 0 at token 0
    return at_end_PGC.flip(-1).cumsum(-1).flip(-1)
