"""Prompts too long for a sequence: skipped, logged and counted, never a crash mid-run.

A prompt and its completion (up to data.sampling.max_tokens) must fit both the packed micro-batch
(data.seq_len tokens) and the engine's context (its model's positions). The limit on prompt tokens is
therefore min(seq_len, context) - max_tokens, or data.max_prompt_tokens when that is set (and lower).

Peers differ on what to do with a longer prompt: TRL cuts it from the left (max_prompt_length), NeMo
RL drops the example (max_input_seq_length). grpokit drops it, like NeMo RL: a cut prompt is another
task, whose reference answer may no longer follow from what is left. Each generation counts the
prompts it dropped (metric `prompts_too_long`) and the run's first three are logged with their environment
and example, so an over-long dataset is visible on step 0 rather than a failure at step 300. Where nothing
fits, the run stops with one line naming the keys (grpokit.orchestrator.driver): a stream after a whole
pass over the data without a prompt that fits, a whole-batch generation when none of its prompts fit.
"""

from __future__ import annotations

import logging

from grpokit.environments.environment import Environment, Example
from grpokit.vision.messages import has_images

log = logging.getLogger(__name__)


def prompt_token_ids(tokenizer, example: Example) -> list[int]:
    """The token ids the engine is given for `example`: its messages in the chat template, ready for
    the assistant's turn; with its verifiers toolsets' schemas for a template that lists tools (as
    verifiers shows them to the model; a template without tool support ignores them). A prompt with
    images is refused: the tokenizer's template would drop them silently (the processor renders it:
    grpokit.orchestrator.image_prompts)."""
    if has_images(example.messages):
        raise ValueError(
            f"example {example.index}: its prompt holds images, which the model's processor renders "
            "(grpokit.orchestrator.image_prompts), not the tokenizer's template: docs/vision.md"
        )
    source = getattr(example, "toolsets", None)
    tools = source.schemas if source is not None and source.schemas else None
    return tokenizer.apply_chat_template(
        example.messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def prompt_token_limit(max_tokens: int, seq_len: int, context: int | None, max_prompt_tokens: int | None) -> int:
    """The most tokens a prompt may have; refuses a completion cap that leaves no room for a prompt in
    the engine's context (`context`: None when the engine does not say)."""
    if context is not None and max_tokens >= context:
        raise ValueError(
            f"data.sampling.max_tokens ({max_tokens}) must be below the model's context ({context} positions, "
            "the engine's max_model_len): lower data.sampling.max_tokens"
        )
    limit = min(seq_len, context or seq_len) - max_tokens
    if max_prompt_tokens is not None:
        if max_prompt_tokens < 1:
            raise ValueError(f"data.max_prompt_tokens must be >= 1 (or null), got {max_prompt_tokens}")
        limit = min(limit, max_prompt_tokens)
    return limit


def split_by_length(
    tokenizer, prompts: list[tuple[Environment, Example]], limit: int, warn: int = 3, ids: list | None = None
) -> tuple[list[tuple[Environment, Example]], list[list[int]], int]:
    """(the prompts of at most `limit` tokens, their token ids, how many were longer); logs the first
    `warn` dropped (the driver: the run's first three; the count goes on in prompts_too_long). The ids go
    on to the engine, so each prompt is tokenised once: `ids`, the prompts' ids when the caller has them
    (prompts with images: grpokit.orchestrator.image_prompts), else they are tokenised here."""
    fitting, fitting_ids, dropped = [], [], []
    for k, (env, ex) in enumerate(prompts):
        ids_k = prompt_token_ids(tokenizer, ex) if ids is None else ids[k]
        if len(ids_k) <= limit:
            fitting.append((env, ex))
            fitting_ids.append(ids_k)
        else:
            dropped.append((env, ex, len(ids_k)))
    for env, ex, n in dropped[:warn]:
        log.warning(
            "environment %r example %d: prompt of %d tokens is over the limit of %d (data.max_prompt_tokens, "
            "or data.seq_len / the model's context minus data.sampling.max_tokens); skipped, counted in "
            "prompts_too_long",
            env.name,
            ex.index,
            n,
            limit,
        )
    return fitting, fitting_ids, len(dropped)
