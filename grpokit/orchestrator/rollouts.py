"""One step's rollouts: prompts -> engine completions -> environment rewards -> Rollout records."""

from __future__ import annotations

import random
from dataclasses import dataclass

from grpokit.env import Environment, Example
from grpokit.inference import InferenceEngine, SamplingSettings
from grpokit.orchestrator.steps import rollout_steps
from grpokit.types import Rollout


@dataclass
class PromptSampler:
    """Walks the examples of the environments in a seeded shuffled order, epoch after epoch.

    Without `ratios` all environments' examples form one pool. With `ratios` (one weight per
    environment) each block of prompts holds a fixed number from each environment (largest-remainder
    rounding of ratio * count), each environment walking its own shuffled order. `take(block, count)` is a
    function of the block index, so a resumed run continues where it stopped.
    """

    envs: list[Environment]
    seed: int
    position: int = 0
    ratios: list[float] | None = None

    def __post_init__(self) -> None:
        self.pool = [(env, ex) for env in self.envs for ex in env.examples]
        if self.ratios is not None and (len(self.ratios) != len(self.envs) or min(self.ratios) < 0 or sum(self.ratios) <= 0):
            raise ValueError(f"data.env ratios must be one non-negative weight per environment with a positive sum, got {self.ratios}")

    def next(self, count: int) -> list[tuple[Environment, Example]]:
        out = [self._pick(self.pool, self.position + i, 0) for i in range(count)]
        self.position += count
        return out

    def take(self, block: int, count: int) -> list[tuple[Environment, Example]]:
        """The `count` prompts of block `block`."""
        if self.ratios is None:
            self.position = block * count
            return self.next(count)
        out = []
        for e, (env, n) in enumerate(zip(self.envs, self.counts(count))):
            pool = [(env, ex) for ex in env.examples]
            out += [self._pick(pool, block * n + i, e + 1) for i in range(n)]
        return out

    def counts(self, count: int) -> list[int]:
        """Prompts per environment in a block of `count` (largest remainder)."""
        total = sum(self.ratios)
        exact = [count * r / total for r in self.ratios]
        counts = [int(x) for x in exact]
        for i in sorted(range(len(exact)), key=lambda i: counts[i] - exact[i])[: count - sum(counts)]:
            counts[i] += 1
        return counts

    def _pick(self, pool: list, position: int, stream: int) -> tuple[Environment, Example]:
        epoch, offset = divmod(position, len(pool))
        order = list(range(len(pool)))
        base = self.seed * 7919 + epoch  # stream 0 (the pooled order) keeps the seed formula results were measured with
        random.Random(base if stream == 0 else base * 31 + stream).shuffle(order)
        return pool[order[offset]]


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
