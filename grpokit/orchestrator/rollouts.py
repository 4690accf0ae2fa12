"""Rollout records: a prompt's single-turn completions and their environment rewards as Rollouts, and
the limits of a multi-turn rollout. Groups are played by grpokit.orchestrator.group_play.

A completion whose engine logprobs are not all finite (a numerics fault in the engine, or a server's
bad answer) keeps its reward, so its group's baseline is unchanged, but none of its tokens is trained on:
its logprobs become 0 and its completion mask 0. It is logged and counted in the batch metric
`env/nonfinite_logprobs` (the fraction of rollouts masked this way). Each completion's finish reason
("stop", "length", "abort") reaches its reward (grpokit.environments.finish) and its Rollout; an aborted
one is scored but not trained on, in the same way (counted in `rollout/finish_abort`).
"""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.environments.conversation import masked_if_nonfinite
from grpokit.environments.environment import Environment, Example
from grpokit.environments.finish import masked_if_aborted
from grpokit.environments.steps import rollout_steps
from grpokit.inference import Completion
from grpokit.types import Rollout
from grpokit.vision.images import PixelBudget


@dataclass
class TurnLimits:
    """How long a multi-turn rollout may grow: `max_turns` assistant turns (a task's own `max_turns`
    wins), and `budget` tokens of prompt + every turn (data.seq_len; None = the engine's context);
    `pixel_budget`: data.pixel_budget, for the images an environment's later turn brings."""

    max_turns: int = 8
    budget: int | None = None
    pixel_budget: PixelBudget | None = None


def sampled_group(
    env: Environment,
    ex: Example,
    prompt_ids: list[int],
    completions: list[Completion],
    group_id: int,
    tokenizer,
    vision=None,
) -> list[Rollout]:
    """One prompt's single-turn completions, scored (and their steps, where the environment reports step
    rewards), as Rollouts; `vision`: the prompt's image inputs, which each of them carries."""
    replies = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
    scores = env.score([ex] * len(completions), replies, [c.finish_reason for c in completions])
    steps = env.step_rewards([ex] * len(completions), replies)
    return [
        Rollout(
            example_id=ex.index,
            env_id=env.name,
            group_id=group_id,
            prompt_ids=list(prompt_ids),
            completion_ids=c.token_ids,
            **logprob_fields(c, metrics, env, ex),
            reward=reward,
            is_truncated=c.is_truncated,
            policy_step=c.policy_step,
            completion_text=text,
            token_steps=c.token_steps,
            finish_reason=c.finish_reason,
            vision=vision,
            **rollout_steps(s, c.token_ids, lambda token_ids: tokenizer.decode(token_ids, skip_special_tokens=True)),
        )
        for c, text, (reward, metrics), s in zip(completions, replies, scores, steps)
    ]


def logprob_fields(completion: Completion, metrics: dict[str, float], env: Environment, example: Example) -> dict:
    """The rollout's completion_logprobs, completion_mask and metrics (see masked_if_nonfinite; an aborted
    completion is not trained on, see masked_if_aborted)."""
    logprobs, mask, metrics = masked_if_nonfinite(
        completion.logprobs, [1] * len(completion.token_ids), metrics, env.name, example.index
    )
    mask = masked_if_aborted(mask, completion.finish_reason, env.name, example.index)
    return {"completion_logprobs": logprobs, "completion_mask": mask, "metrics": metrics}
