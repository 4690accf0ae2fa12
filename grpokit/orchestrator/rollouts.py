"""One step's rollouts: prompts -> engine completions -> environment rewards -> Rollout records."""

from __future__ import annotations

from grpokit.env import Environment, Example
from grpokit.inference import InferenceEngine, SamplingSettings
from grpokit.orchestrator.steps import rollout_steps
from grpokit.types import Rollout


def generate_rollouts(
    engine: InferenceEngine,
    tokenizer,
    prompts: list[tuple[Environment, Example]],
    rollouts_per_example: int,
    sampling: SamplingSettings,
    first_group_id: int,
) -> list[list[Rollout]]:
    """Sample `rollouts_per_example` completions per prompt and score them (and their steps, where the
    environment reports step rewards); one list per group."""
    prompt_ids = [tokenizer.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=True, return_dict=False) for _, ex in prompts]
    completions = engine.generate(prompt_ids, rollouts_per_example, sampling)
    groups = []
    for g, ((env, ex), ids, comps) in enumerate(zip(prompts, prompt_ids, completions)):
        replies = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in comps]
        scores = env.score([ex] * len(comps), replies)
        steps = env.step_rewards([ex] * len(comps), replies)
        groups.append([
            Rollout(
                example_id=ex.index, env_id=env.name, group_id=first_group_id + g, prompt_ids=list(ids),
                completion_ids=c.token_ids, completion_logprobs=c.logprobs, completion_mask=[1] * len(c.token_ids),
                reward=reward, is_truncated=c.is_truncated, policy_step=c.policy_step, completion_text=text, metrics=metrics,
                **rollout_steps(s, c.token_ids, lambda token_ids: tokenizer.decode(token_ids, skip_special_tokens=True)),
            )
            for c, text, (reward, metrics), s in zip(comps, replies, scores, steps)
        ])
    return groups
