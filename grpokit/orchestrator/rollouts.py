"""One step's rollouts: prompts -> engine completions -> environment rewards -> Rollout records.

A completion whose engine logprobs are not all finite (a numerics fault in the engine, or a server's
bad answer) keeps its reward, so its group's baseline is unchanged, but none of its tokens is trained on:
its logprobs become 0 and its completion mask 0. It is logged and counted in the batch metric
`env/nonfinite_logprobs` (the fraction of rollouts masked this way).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

from grpokit.inference import Completion, InferenceEngine, SamplingSettings
from grpokit.orchestrator.conversation import is_multi_turn, masked_if_nonfinite
from grpokit.orchestrator.environment import Environment, Example
from grpokit.orchestrator.episodes import play_episodes
from grpokit.orchestrator.multi_turn import conversation_rollouts, generate_conversations
from grpokit.orchestrator.prompt_length import prompt_token_ids
from grpokit.orchestrator.steps import rollout_steps
from grpokit.types import Rollout


@dataclass
class TurnLimits:
    """How long a multi-turn rollout may grow: `max_turns` assistant turns (a task's own `max_turns`
    wins), and `budget` tokens of prompt + every turn (data.seq_len; None = the engine's context)."""

    max_turns: int = 8
    budget: int | None = None


def generate_rollouts(
    engine: InferenceEngine,
    tokenizer,
    prompts: list[tuple[Environment, Example]],
    rollouts_per_example: int,
    sampling: SamplingSettings,
    first_group_id: int,
    prompt_ids: list[list[int]] | None = None,
    turns: TurnLimits | None = None,
) -> list[list[Rollout]]:
    """Sample `rollouts_per_example` completions per prompt and score them (and their steps, where the
    environment reports step rewards); one list per group. `prompt_ids`: the prompts' token ids when the
    caller has them already (the length check tokenised them), else they are tokenised here. Prompts of
    multi-turn tasks (tools, or a `respond` method) run as conversations within `turns`' limits, and
    those of environments with an Env of their own as its episodes (grpokit.orchestrator.episodes)."""
    if not prompts:  # every prompt of the block was too long (grpokit.orchestrator.prompt_length)
        return []
    if prompt_ids is None:
        prompt_ids = [prompt_token_ids(tokenizer, ex) for _, ex in prompts]
    kinds = [_kind(env, ex) for env, ex in prompts]
    if any(k != "single" for k in kinds):
        return _with_conversations(
            engine, tokenizer, prompts, prompt_ids, kinds, rollouts_per_example, sampling, first_group_id, turns
        )
    completions = engine.generate(prompt_ids, rollouts_per_example, sampling)
    return [
        sampled_group(env, ex, ids, comps, first_group_id + g, tokenizer)
        for g, ((env, ex), ids, comps) in enumerate(zip(prompts, prompt_ids, completions))
    ]


def sampled_group(
    env: Environment, ex: Example, prompt_ids: list[int], completions: list[Completion], group_id: int, tokenizer
) -> list[Rollout]:
    """One prompt's single-turn completions, scored (and their steps, where the environment reports step
    rewards), as Rollouts."""
    replies = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
    scores = env.score([ex] * len(completions), replies)
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
            **rollout_steps(s, c.token_ids, lambda token_ids: tokenizer.decode(token_ids, skip_special_tokens=True)),
        )
        for c, text, (reward, metrics), s in zip(completions, replies, scores, steps)
    ]


def _kind(env: Environment, example: Example) -> str:
    """How a prompt is played: an `episode` of the environment's own verifiers Env, a `conversation` of a
    multi-turn task (tools, `respond`, verifiers toolsets), or `single`-turn sampling."""
    if getattr(env, "episode_env", None) is not None:
        return "episode"
    return "conversation" if is_multi_turn(example.task, getattr(example, "toolsets", None)) else "single"


def _with_conversations(
    engine, tokenizer, prompts, prompt_ids, kinds, rollouts_per_example, sampling, first_group_id, turns
) -> list[list[Rollout]]:
    """Episodes, conversations and single-turn samples for the prompts of each kind (see _kind); the
    groups in prompt order, with consecutive group ids from first_group_id."""
    turns = turns or TurnLimits()
    budget = min(turns.budget or sys.maxsize, engine.context_length() or sys.maxsize)
    at = {kind: [i for i, k in enumerate(kinds) if k == kind] for kind in ("episode", "conversation", "single")}
    groups: dict[int, list[Rollout]] = {}
    if at["episode"]:
        conversations, scores = play_episodes(
            engine,
            tokenizer,
            [prompts[i] for i in at["episode"]],
            rollouts_per_example,
            sampling,
            budget,
            turns.max_turns,
            engine.context_length() or sys.maxsize,
        )
        groups.update(zip(at["episode"], conversation_rollouts(conversations, 0, tokenizer, scores)))
    if at["conversation"]:
        conversations = generate_conversations(
            engine,
            tokenizer,
            [prompts[i] for i in at["conversation"]],
            [prompt_ids[i] for i in at["conversation"]],
            rollouts_per_example,
            sampling,
            budget,
            turns.max_turns,
        )
        groups.update(zip(at["conversation"], conversation_rollouts(conversations, 0, tokenizer)))
    if at["single"]:
        sampled = generate_rollouts(
            engine,
            tokenizer,
            [prompts[i] for i in at["single"]],
            rollouts_per_example,
            sampling,
            0,
            [prompt_ids[i] for i in at["single"]],
        )
        groups.update(zip(at["single"], sampled))
    return [[replace(r, group_id=first_group_id + i) for r in groups[i]] for i in range(len(prompts))]


def logprob_fields(completion: Completion, metrics: dict[str, float], env: Environment, example: Example) -> dict:
    """The rollout's completion_logprobs, completion_mask and metrics (see masked_if_nonfinite)."""
    logprobs, mask, metrics = masked_if_nonfinite(
        completion.logprobs, [1] * len(completion.token_ids), metrics, env.name, example.index
    )
    return {"completion_logprobs": logprobs, "completion_mask": mask, "metrics": metrics}
