"""Zero-std group filtering (the groups DAPO's dynamic sampling removes, Yu et al. 2025): every rollout of
a group (same group_id) is flagged when the group's rewards are all equal,

    r_i == r_j  for all i, j in the group        (std_g r = 0)

Every Advantage gives such a group exactly 0 (the Advantage contract), so its rollouts carry no
policy-gradient signal. Equality is exact, as in `zero_flat_groups`; a group of one rollout is flagged.

Departure from DAPO: DAPO drops these groups and samples more prompts until the batch is full of
informative ones. Here a flagged rollout is only masked: it is still packed and forwarded, so enforcing
saves no compute; what it changes is the loss normaliser (the loss tokens or sequences of the step
exclude these rollouts, so the informative ones weigh more, as in DAPO's batch) and any loss term that
does not scale with the advantage (a KL penalty) stops applying to them.

Default enforce: False. Because enforcing rescales every step by a batch-dependent factor, it is an
optimisation change to opt into, not a safe default; monitoring logs `filter/zerostd`, the fraction of
rollouts in flat groups (prime-rl's `zero_advantage` filter enforces by default, but it drops the
rollouts before the trainer, where it does save compute).
"""

from __future__ import annotations

from grpokit.filter import Filter
from grpokit.types import Rollout


class ZeroStd(Filter):
    """Flags every rollout of a group whose rewards are all equal (zero advantage; DAPO's dynamic sampling)."""

    def __init__(self, enforce: bool = False) -> None:
        """
        Args:
            enforce: mask flagged rollouts out of the loss (True) or only count them (False, the default:
                masking changes the loss normaliser).
        """
        super().__init__(enforce=enforce)

    def flag(self, rollouts: list[Rollout]) -> list[bool]:
        rewards: dict[int, set[float]] = {}
        for r in rollouts:
            rewards.setdefault(r.group_id, set()).add(r.reward)
        return [len(rewards[r.group_id]) == 1 for r in rollouts]
