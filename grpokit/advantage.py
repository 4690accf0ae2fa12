"""The `advantage` kind: turns a step's rewards into advantages, per rollout or per token.

Shape legend: P prompts (groups), G rollouts per prompt, C completion tokens.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from grpokit.types import Rollout


class Advantage(ABC):
    """Contract: `advantage(rewards_PG, lengths_PG) -> advantages_PG`.

    Rows are groups of rollouts of the same prompt. Pure tensor function: no state, same dtype and shape
    out as in, finite for finite input (a group whose rewards are all equal gets advantage 0).

    `lengths_PG` counts each rollout's trained tokens (`Rollout.completion_mask` 1), as verl's response
    length does: a multi-turn rollout's tool results and user turns sit in its completion_ids but are not
    trained on, so they are not part of its length. A single-turn rollout's length is its completion's;
    one whose logprobs were non-finite (masked out of the loss) has length 0.

    The orchestrator calls `token_advantages(groups)`, one advantage per completion token; by default
    each rollout's advantage from `__call__` on every token of its completion. An estimator that assigns
    credit within a completion (Process) overrides it; with one step per rollout that ends at its last
    token, rewarded with the outcome reward, it must agree with `__call__` (checked by
    grpokit.testing.check_advantage).

    `uses_outcome_reward`: the advantages depend on `Rollout.reward` (the default). An estimator that
    reads only step rewards (Process) sets it False, and `data.kl_in_reward`, which shapes that reward,
    refuses it at start rather than have no effect.
    """

    uses_outcome_reward: bool = True

    @abstractmethod
    def __call__(self, rewards_PG: torch.Tensor, lengths_PG: torch.Tensor) -> torch.Tensor:
        """Return the advantage of each rollout (shape P x G)."""

    def token_advantages(self, groups: list[list[Rollout]]) -> list[list[float]]:
        """Each rollout's advantage of each of its completion tokens, groups flattened in order."""
        if not groups:
            return []
        rewards_PG = torch.tensor([[r.reward for r in g] for g in groups], dtype=torch.float64)
        lengths_PG = torch.tensor([[sum(r.completion_mask) for r in g] for g in groups], dtype=torch.float64)
        advantages = self.checked(self(rewards_PG, lengths_PG), rewards_PG).flatten().tolist()
        return [[a] * len(r.completion_ids) for a, r in zip(advantages, (r for g in groups for r in g))]

    def checked(self, advantages_PG: torch.Tensor, rewards_PG: torch.Tensor) -> torch.Tensor:
        """`advantages_PG`, refused (named) unless it has the rewards' shape and is finite where they are:
        a P-shaped or NaN output used to be paired short or blamed on the loss steps later."""
        name, tensor = type(self).__name__, isinstance(advantages_PG, torch.Tensor)
        if tensor and advantages_PG.shape != rewards_PG.shape and advantages_PG.numel() == rewards_PG.numel():
            advantages_PG = advantages_PG.reshape(rewards_PG.shape)  # flat P*G, in rollout order: as before
        if not tensor or advantages_PG.shape != rewards_PG.shape:
            got = tuple(advantages_PG.shape) if tensor else type(advantages_PG).__name__
            raise ValueError(
                f"data.advantage: {name} returned {got} for rewards of shape {tuple(rewards_PG.shape)}; an "
                "Advantage returns one value per rollout, P x G (grpokit.testing.check_component checks it)"
            )
        if not torch.isfinite(advantages_PG).all():  # the rewards are finite (RunDataError otherwise)
            raise ValueError(f"data.advantage: {name} returned non-finite advantages for finite rewards")
        return advantages_PG


def zero_flat_groups(advantages_PG: torch.Tensor, rewards_PG: torch.Tensor) -> torch.Tensor:
    """`advantages_PG` with every group whose rewards are all equal set to exactly 0.

    The Advantage contract promises 0 there, and arithmetic alone does not deliver it: r - mean(r) over
    three rewards of 0.1 leaves 1.4e-17, which a std division with eps = 0 turns into -1 (or 0/0 = NaN
    when the rounding happens to cancel).
    """
    flat_P1 = (rewards_PG == rewards_PG[..., :1]).all(-1, keepdim=True)
    return advantages_PG.masked_fill(flat_P1, 0.0)
