"""A plain, batched autoregressive sampler with a KV cache, returning per-token logprobs.

Per step: logits -> min_tokens mask and repetition penalty (grpokit.inference.logits_processors) ->
temperature -> top-p -> sample. Logprobs are of the processed, temperature-scaled distribution before
top-p: the distribution each token was drawn from, up to the top-p truncation.

Shape legend: B sequences in the batch, P padded prompt length, V vocabulary, S stop token ids.
"""

from __future__ import annotations

import functools
import inspect

import torch

from grpokit.inference import SamplingSettings
from grpokit.inference.logits_processors import apply_min_tokens, apply_repetition_penalty, mark_seen, seen_tokens


def sample_next(
    logits_BV: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (token_B, logprob_B) with logprobs of the temperature-scaled softmax."""
    logits_BV = logits_BV.float()
    if temperature == 0:
        logprobs_BV = torch.log_softmax(logits_BV, -1)
        token_B = logprobs_BV.argmax(-1)
        return token_B, logprobs_BV.gather(-1, token_B[:, None]).squeeze(-1)
    logprobs_BV = torch.log_softmax(logits_BV / temperature, -1)
    probs_BV = logprobs_BV.exp()
    if top_p < 1.0:
        sorted_BV, order_BV = probs_BV.sort(-1, descending=True)
        drop_BV = sorted_BV.cumsum(-1) - sorted_BV > top_p  # keep the smallest prefix with mass >= top_p
        probs_BV = torch.zeros_like(probs_BV).scatter_(-1, order_BV, sorted_BV.masked_fill(drop_BV, 0.0))
    token_B = torch.multinomial(probs_BV, 1, generator=generator).squeeze(-1)
    return token_B, logprobs_BV.gather(-1, token_B[:, None]).squeeze(-1)


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    prompts: list[list[int]],
    sampling: SamplingSettings,
    stop_token_ids: set[int],
    pad_token_id: int,
    generator: torch.Generator,
    decode=None,
) -> list[tuple[list[int], list[float], bool]]:
    """Sample one completion per prompt: (token ids, logprobs, is_truncated) each.

    Prompts are left-padded; positions count from each prompt's first real token. A completion ends at
    its first stop token (kept) or when `decode(tokens)` gains a stop string (kept). Before
    `sampling.min_tokens` tokens, stop tokens are masked and stop strings do not count (vLLM's rule: a
    stop string completed earlier never ends the completion later). A finished completion's row leaves
    the batch (and the KV cache), so the later steps compute only the live ones.
    """
    device = next(model.parameters()).device
    b = len(prompts)
    input_ids_BP, mask_BP, positions_BP, cache, logits_BV = prefill(model, prompts, pad_token_id, device)
    stop_ids_S = torch.tensor(sorted(stop_token_ids), dtype=torch.long, device=device)
    seen_BV = (
        seen_tokens(input_ids_BP, mask_BP.bool(), logits_BV.shape[-1]) if sampling.repetition_penalty != 1.0 else None
    )
    temperature = 1.0 if sampling.temperature is None else sampling.temperature
    next_pos_B1 = positions_BP[:, -1:] + 1
    tokens: list[list[int]] = [[] for _ in range(b)]
    logprobs: list[list[float]] = [[] for _ in range(b)]
    stop_strings_seen = [0] * b
    done = [False] * b
    live = list(range(b))  # the completion each batch row samples; finished rows leave the batch
    for n in range(sampling.max_tokens):
        logits_BV = logits_BV.float()
        if n < sampling.min_tokens:  # every row has generated n tokens
            logits_BV = apply_min_tokens(
                logits_BV, torch.full((len(live),), n, device=device), sampling.min_tokens, stop_ids_S
            )
        if seen_BV is not None:
            logits_BV = apply_repetition_penalty(logits_BV, seen_BV, sampling.repetition_penalty)
        token_B, logprob_B = sample_next(logits_BV, temperature, sampling.top_p, generator)
        if seen_BV is not None:
            mark_seen(seen_BV, token_B)
        for i, tok, lp in zip(live, token_B.tolist(), logprob_B.tolist()):
            tokens[i].append(tok)
            logprobs[i].append(lp)
            done[i] = tok in stop_token_ids or stop_string_ended(tokens[i], sampling, decode, stop_strings_seen, i)
        if all(done):
            break
        if any(done[i] for i in live):  # drop finished rows: later steps compute only live completions
            rows_B = torch.tensor([j for j, i in enumerate(live) if not done[i]], device=device)
            cache.reorder_cache(rows_B)
            token_B, mask_BP, next_pos_B1 = token_B[rows_B], mask_BP[rows_B], next_pos_B1[rows_B]
            seen_BV = seen_BV[rows_B] if seen_BV is not None else None
            live = [i for i in live if not done[i]]
        mask_BP = torch.cat([mask_BP, torch.ones((len(live), 1), dtype=mask_BP.dtype, device=device)], dim=1)
        logits_BV = model(
            input_ids=token_B[:, None],
            attention_mask=mask_BP,
            position_ids=next_pos_B1,
            **cache_kwarg(model, cache),
            use_cache=True,
        ).logits[:, -1]
        next_pos_B1 = next_pos_B1 + 1
    return [(tokens[i], logprobs[i], not done[i]) for i in range(b)]


def prefill(model: torch.nn.Module, prompts: list[list[int]], pad_token_id: int, device):
    """Run the prompts through the model once, left-padded: (input_ids_BP, mask_BP, positions_BP, KV
    cache, last-position logits_BV).

    Each distinct prompt is computed once and its cache rows copied to its repeats (a GRPO batch is G
    copies of each prompt); the LM head runs on the last position only (`logits_to_keep=1`). Both are
    exact: the rows of a repeated prompt are the same numbers.
    """
    from transformers import DynamicCache

    rows: dict[tuple[int, ...], int] = {}
    row_B = torch.tensor([rows.setdefault(tuple(ids), len(rows)) for ids in prompts], device=device)
    distinct = [list(ids) for ids in rows]
    u, p = len(distinct), max(len(x) for x in distinct)
    input_ids_UP = torch.full((u, p), pad_token_id, dtype=torch.long, device=device)
    mask_UP = torch.zeros((u, p), dtype=torch.long, device=device)
    for i, ids in enumerate(distinct):
        input_ids_UP[i, p - len(ids) :] = torch.tensor(ids, device=device)
        mask_UP[i, p - len(ids) :] = 1
    positions_UP = (mask_UP.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    logits_UV = model(
        input_ids=input_ids_UP,
        attention_mask=mask_UP,
        position_ids=positions_UP,
        **cache_kwarg(model, cache),
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]
    if u < len(prompts):
        cache.reorder_cache(row_B)  # index_select along the batch: each prompt's rows to its repeats
    return input_ids_UP[row_B], mask_UP[row_B], positions_UP[row_B], cache, logits_UV[row_B]


def stop_string_ended(tokens: list[int], sampling: SamplingSettings, decode, seen: list[int], row: int) -> bool:
    """Whether the latest token completed a new stop string, counting only once min_tokens are reached.

    `seen[row]` holds the number of stop-string occurrences in the row's text after its previous token.
    """
    if not (sampling.stop and decode):
        return False
    text = decode(tokens)
    count = sum(text.count(s) for s in sampling.stop)
    new, seen[row] = count > seen[row], count
    return new and len(tokens) >= sampling.min_tokens


@functools.cache
def _cache_parameter(forward) -> str:
    """The name under which the model's forward takes its KV cache: `cache` in transformers >= 5.2x,
    `past_key_values` before (passing the old name to a new version warns on every decoding step)."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def cache_kwarg(model: torch.nn.Module, cache) -> dict:
    """`{name: cache}` for the model's forward (a peft wrapper passes its keyword arguments through)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_cache_parameter(type(base).forward): cache}
