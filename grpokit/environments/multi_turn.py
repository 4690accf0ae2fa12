"""Multi-turn rollouts: the engine writes an assistant turn, the environment answers (tool results, a
user's or a game's reply), until the environment ends the rollout, `max_turns`, or the sequence budget.

The turns are played in a generation stream by grpokit.orchestrator.group_play: the first turn asks
n = G completions per prompt, later turns one per conversation (each conversation's own token ids as its
prompt, submitted as soon as the environment has answered), so any engine (builtin, `grpokit infer`
through RemoteEngine, vLLM) serves multi-turn rollouts unchanged. This module holds one turn's rules
(`take_turn`) and the finished conversations' Rollouts.

The budget: a turn starts only if the conversation plus `max_tokens` fits `seq_len` (and the engine's
context); otherwise the rollout ends at the turn boundary before it, marked truncated, so the trained
sequence holds whole turns. An environment turn too long to fit is told from its characters before it
is rendered (grpokit.environments.conversation.over_budget: logged, counted in env/oversized_turns). A
turn that hits max_tokens without a stop ends the rollout, truncated; a turn the engine aborted ends it
too, and the rollout is scored (its trace says "abort") but not trained on (grpokit.environments.finish).
Each turn's finish reason is kept (Rollout.turn_finish_reasons).
"""

from __future__ import annotations

from grpokit.environments.chat_tokens import ChatTokens
from grpokit.environments.conversation import Conversation, environment_turn, masked_if_nonfinite, over_budget
from grpokit.environments.finish import masked_if_aborted
from grpokit.environments.image_turns import render_turn
from grpokit.types import Rollout

SEED_STRIDE = 1_000_033  # turn t of a step samples with seed * SEED_STRIDE + t (t = 0: the step's own seed)


def take_turn(
    conv: Conversation, completion, tokenizer, chat: ChatTokens, budget, max_tokens, max_turns, images=None
) -> None:
    """Record the model's reply, then the environment's answer, or end the conversation. `images`: the
    ImageTurns that renders an answer with images (grpokit.environments.image_turns)."""
    conv.add_completion(completion, tokenizer.decode(completion.token_ids, skip_special_tokens=True))
    if completion.finish_reason != "stop":  # a reply cut (max_tokens, an abort) ends the rollout; a game's turn earns 0
        conv.turn_rewards.append(0.0 if callable(getattr(conv.example.task, "respond", None)) else None)
        conv.done, conv.is_truncated = True, completion.is_truncated
        return
    last = conv.turns >= int(getattr(conv.example.task, "max_turns", None) or max_turns)
    answer = environment_turn(conv, last_turn=last, budget=images.budget if images is not None else None)
    conv.turn_rewards.append(answer.reward)
    if answer.done or last:
        conv.done = True
        return
    room = budget - conv.num_tokens - max_tokens
    if over_budget(conv, chat, answer.messages, room):  # too long to fit, told before rendering it: logged
        conv.done = conv.is_truncated = True
        return
    where = f"environment {conv.env.name!r} example {conv.example.index}"
    env_ids, vision, count = render_turn(images, where, chat, completion.token_ids, answer.messages, conv.images_held)
    if len(env_ids) > room:  # the next turn might not fit: end at this boundary
        conv.done = conv.is_truncated = True
        return
    conv.add_environment(env_ids, answer.messages, vision, count)


def conversation_rollouts(
    groups: list[list[Conversation]], first_group_id: int, tokenizer, scores: list[list] | None = None
) -> list[list[Rollout]]:
    """Score the finished conversations with their tasks (unless `scores` has each group's (reward,
    metrics) already) and turn them into Rollouts (one group per prompt). Per-turn rewards, when the
    environment gives any, become step rewards at each turn's last token; a turn without one (a reply
    cut at max_tokens, a tool turn) counts 0."""
    out = []
    for g, group in enumerate(groups):
        env = group[0].env
        if scores is not None:
            out.append(_rollouts(group, scores[g], first_group_id + g, tokenizer))
            continue
        states = [c.toolsets.state if c.toolsets is not None else None for c in group]
        with_states = {"states": states} if any(s is not None for s in states) else {}  # the toolsets' State
        reasons = [c.finish_reasons for c in group]  # each turn's, on its trace (grpokit.environments.finish)
        examples, chats = [c.example for c in group], [c.messages for c in group]
        group_scores = env.score_conversations(examples, chats, **with_states, finish_reasons=reasons)
        out.append(_rollouts(group, group_scores, first_group_id + g, tokenizer))
    return out


def _rollouts(group: list[Conversation], scores: list, group_id: int, tokenizer) -> list[Rollout]:
    env, ex = group[0].env, group[0].example
    rollouts = []
    for conv, (reward, metrics) in zip(group, scores):
        logprobs, mask, metrics = masked_if_nonfinite(conv.logprobs, conv.mask, metrics, env.name, ex.index)
        mask = masked_if_aborted(mask, conv.finish_reason, env.name, ex.index)  # an aborted last turn: not trained
        rewarded = any(r is not None for r in conv.turn_rewards)
        per_turn = [0.0 if r is None else float(r) for r in conv.turn_rewards] if rewarded else None
        rollouts.append(
            Rollout(
                example_id=ex.index,
                env_id=env.name,
                group_id=group_id,
                prompt_ids=conv.prompt_ids,
                completion_ids=conv.ids,
                completion_logprobs=logprobs,
                completion_mask=mask,
                reward=reward,
                is_truncated=conv.is_truncated,
                policy_step=min(conv.policy_steps),
                completion_text=tokenizer.decode(conv.ids, skip_special_tokens=False),
                metrics={**metrics, **conv.metrics()},
                step_rewards=per_turn,
                step_ends=conv.turn_ends if per_turn else None,
                messages=conv.messages,
                token_steps=conv.token_steps if len(set(conv.token_steps)) > 1 else None,
                finish_reason=conv.finish_reason,
                turn_finish_reasons=list(conv.finish_reasons),
                vision=conv.vision,  # every turn was sampled, and is scored, with the images so far
            )
        )
    return rollouts
