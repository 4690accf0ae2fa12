"""One step's rollouts: prompts -> engine completions -> environment rewards -> Rollout records."""

from __future__ import annotations

import random
from dataclasses import dataclass

from grpokit.env import Environment, Example
from grpokit.inference import InferenceEngine, SamplingSettings
from grpokit.types import Rollout


@dataclass
class PromptSampler:
    """Walks the examples of all environments in a seeded shuffled order, epoch after epoch.

    `position` counts examples handed out so far, so a resumed run continues where it stopped.
    """

    envs: list[Environment]
    seed: int
    position: int = 0

    def __post_init__(self) -> None:
        self.pool = [(env, ex) for env in self.envs for ex in env.examples]

    def next(self, count: int) -> list[tuple[Environment, Example]]:
        out = []
        for _ in range(count):
            epoch, offset = divmod(self.position, len(self.pool))
            order = list(range(len(self.pool)))
            random.Random(self.seed * 7919 + epoch).shuffle(order)
            out.append(self.pool[order[offset]])
            self.position += 1
        return out


def generate_rollouts(
    engine: InferenceEngine,
    tokenizer,
    prompts: list[tuple[Environment, Example]],
    rollouts_per_example: int,
    sampling: SamplingSettings,
    first_group_id: int,
) -> list[list[Rollout]]:
    """Sample `rollouts_per_example` completions per prompt and score them; one list per group."""
    prompt_ids = [tokenizer.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=True, return_dict=False) for _, ex in prompts]
    completions = engine.generate(prompt_ids, rollouts_per_example, sampling)
    groups = []
    for g, ((env, ex), ids, comps) in enumerate(zip(prompts, prompt_ids, completions)):
        replies = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in comps]
        scores = env.score([ex] * len(comps), replies)
        groups.append([
            Rollout(
                example_id=ex.index, env_id=env.name, group_id=first_group_id + g, prompt_ids=list(ids),
                completion_ids=c.token_ids, completion_logprobs=c.logprobs, completion_mask=[1] * len(c.token_ids),
                reward=reward, is_truncated=c.is_truncated, policy_step=c.policy_step, completion_text=text, metrics=metrics,
            )
            for c, text, (reward, metrics) in zip(comps, replies, scores)
        ])
    return groups
