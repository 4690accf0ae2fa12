"""Hand-built Rollouts for unit tests of filters, advantages, packing and the orchestrator's steps."""

from __future__ import annotations

from collections.abc import Sequence

from grpokit.types import Rollout


def make_rollout(
    completion_ids: Sequence[int] = (7, 8),
    *,
    prompt_ids: Sequence[int] = (1,),
    logprobs: Sequence[float] | None = None,
    mask: Sequence[int] | None = None,
    reward: float = 0.0,
    group_id: int = 0,
    example_id: int | None = None,
    **fields,
) -> Rollout:
    """A sampled Rollout of environment "e" at policy step 0, not truncated: `completion_ids` after
    `prompt_ids`, each completion token with logprob -0.5 and mask 1 unless `logprobs` / `mask` say
    otherwise; `example_id` is `group_id` unless given. Any other Rollout field by keyword (env_id,
    policy_step, step_rewards, ...). Only what a test varies is then written at its call site."""
    n = len(completion_ids)
    values = dict(env_id="e", is_truncated=False, policy_step=0) | fields
    return Rollout(
        example_id=group_id if example_id is None else example_id,
        group_id=group_id,
        prompt_ids=list(prompt_ids),
        completion_ids=list(completion_ids),
        completion_logprobs=[-0.5] * n if logprobs is None else list(logprobs),
        completion_mask=[1] * n if mask is None else list(mask),
        reward=reward,
        **values,
    )


def make_group(rewards: Sequence[float], group_id: int = 0, **fields) -> list[Rollout]:
    """One prompt's group: a make_rollout per reward, all with `group_id` (and its example id)."""
    return [make_rollout(reward=reward, group_id=group_id, **fields) for reward in rewards]
