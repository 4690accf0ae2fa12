"""A plain, batched autoregressive sampler with a KV cache, returning per-token logprobs.

Per step: logits -> min_tokens mask and repetition penalty (grpokit.inference.logits_processors) ->
temperature -> top-p -> sample. Logprobs are of the processed, temperature-scaled distribution before
top-p: the distribution each token was drawn from, up to the top-p truncation. A server's request may
ask for each token's k most likely alternatives (top logprobs) from that same distribution, follow the
tokens step by step (streaming), or stop the loop between steps (its client hung up): ServingOptions.

Shape legend: B sequences in the batch, P padded prompt length, V vocabulary, S stop token ids.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field

import torch

from grpokit.inference import NewTokens, SamplingSettings, ServingOptions
from grpokit.inference.logits_processors import apply_min_tokens, apply_repetition_penalty, mark_seen, seen_tokens
from grpokit.inference.prefix_cache import PrefixCache


def scaled_logprobs(logits_BV: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature) in float32 (greedy, temperature 0: of the logits as they are):
    the distribution a token is drawn from, whose logprobs the engine reports."""
    logits_BV = logits_BV.float()
    return torch.log_softmax(logits_BV if temperature == 0 else logits_BV / temperature, -1)


def draw(logprobs_BV: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> torch.Tensor:
    """One token per row from `scaled_logprobs`: the argmax at temperature 0, else a draw from the top-p
    nucleus (the smallest prefix of the sorted distribution with mass >= top_p)."""
    if temperature == 0:
        return logprobs_BV.argmax(-1)
    probs_BV = logprobs_BV.exp()
    if top_p < 1.0:
        sorted_BV, order_BV = probs_BV.sort(-1, descending=True)
        drop_BV = sorted_BV.cumsum(-1) - sorted_BV > top_p  # keep the smallest prefix with mass >= top_p
        probs_BV = torch.zeros_like(probs_BV).scatter_(-1, order_BV, sorted_BV.masked_fill(drop_BV, 0.0))
    return torch.multinomial(probs_BV, 1, generator=generator).squeeze(-1)


def sample_next(
    logits_BV: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (token_B, logprob_B) with logprobs of the temperature-scaled softmax."""
    logprobs_BV = scaled_logprobs(logits_BV, temperature)
    token_B = draw(logprobs_BV, temperature, top_p, generator)
    return token_B, logprobs_BV.gather(-1, token_B[:, None]).squeeze(-1)


@dataclass
class Row:
    """One completion as the decode loop builds it; `done` once it has stopped (else it is truncated)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] | None = None
    done: bool = False
    stop_strings_seen: int = 0


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
    """Sample one completion per prompt: (token ids, logprobs, is_truncated) each (see `sample_rows`)."""
    rows = sample_rows(model, prompts, sampling, stop_token_ids, pad_token_id, generator, decode)
    return [(r.token_ids, r.logprobs, not r.done) for r in rows]


@torch.no_grad()
def sample_rows(
    model: torch.nn.Module,
    prompts: list[list[int]],
    sampling: SamplingSettings,
    stop_token_ids: set[int],
    pad_token_id: int,
    generator: torch.Generator,
    decode=None,
    options: ServingOptions | None = None,
    first_index: int = 0,
    prefix_cache: PrefixCache | None = None,
) -> list[Row]:
    """Sample one completion per prompt.

    Prompts are left-padded; positions count from each prompt's first real token. A completion ends at
    its first stop token (kept) or when `decode(tokens)` gains a stop string (kept). Before
    `sampling.min_tokens` tokens, stop tokens are masked and stop strings do not count (vLLM's rule: a
    stop string completed earlier never ends the completion later). A finished completion's row leaves
    the batch (and the KV cache), so the later steps compute only the live ones.

    `options` (a server's request): `top_logprobs` k adds each token's k likeliest alternatives from its
    logprob's distribution; `on_tokens` gets each step's new tokens (prompt i's as index first_index + i);
    `cancelled` stops the loop before the next step, rows as they are. Without options, no cost.
    `prefix_cache`: prompts extending a cached sequence prefill only their new tokens, and each finished
    row's keys and values are kept for later prompts (grpokit.inference.prefix_cache).
    """
    prefilled = prefill(model, prompts, pad_token_id, next(model.parameters()).device, prefix_cache)
    return decode_rows(model, prompts, prefilled, sampling, stop_token_ids, generator, decode, options, first_index,
                       prefix_cache)  # fmt: skip


def decode_rows(
    model: torch.nn.Module,
    prompts: list[list[int]],
    prefilled: tuple,
    sampling: SamplingSettings,
    stop_token_ids: set[int],
    generator: torch.Generator,
    decode=None,
    options: ServingOptions | None = None,
    first_index: int = 0,
    prefix_cache: PrefixCache | None = None,
) -> list[Row]:
    """`sample_rows`' decode loop from `prefilled`, what `prefill` returns for `prompts` (or, for a prompt
    with images, grpokit.inference.image_rows.image_prefill)."""
    device = next(model.parameters()).device
    input_ids_BP, mask_BP, positions_BP, cache, logits_BV = prefilled
    stop_ids_S = torch.tensor(sorted(stop_token_ids), dtype=torch.long, device=device)
    seen_BV = (
        seen_tokens(input_ids_BP, mask_BP.bool(), logits_BV.shape[-1]) if sampling.repetition_penalty != 1.0 else None
    )
    temperature = 1.0 if sampling.temperature is None else sampling.temperature
    top_k = min(options.top_logprobs, logits_BV.shape[-1]) if options is not None else 0
    next_pos_B1 = positions_BP[:, -1:] + 1
    rows = [Row(top_logprobs=[] if top_k else None) for _ in prompts]
    live = list(range(len(prompts)))  # the completion each batch row samples; finished rows leave the batch
    for n in range(sampling.max_tokens):
        if options is not None and options.is_cancelled():
            break
        logits_BV = processed_logits(logits_BV, n, sampling, stop_ids_S, seen_BV)
        token_B, logprob_B, top = next_tokens(logits_BV, temperature, sampling.top_p, generator, top_k)
        if seen_BV is not None:
            mark_seen(seen_BV, token_B)
        record(rows, live, token_B, logprob_B, top, stop_token_ids, sampling, decode, options, first_index)
        last = all(r.done for r in rows) or n == sampling.max_tokens - 1  # no forward for a token never sampled
        if prefix_cache is not None:
            keep_finished(prefix_cache, cache, mask_BP, prompts, rows, live, last)
        if last:
            break
        if any(rows[i].done for i in live):  # drop finished rows: later steps compute only live completions
            rows_B = torch.tensor([j for j, i in enumerate(live) if not rows[i].done], device=device)
            cache.reorder_cache(rows_B)
            token_B, mask_BP, next_pos_B1 = token_B[rows_B], mask_BP[rows_B], next_pos_B1[rows_B]
            seen_BV = seen_BV[rows_B] if seen_BV is not None else None
            live = [i for i in live if not rows[i].done]
        mask_BP = torch.cat([mask_BP, torch.ones((len(live), 1), dtype=mask_BP.dtype, device=device)], dim=1)
        logits_BV = decode_step(model, cache, token_B, mask_BP, next_pos_B1)
        next_pos_B1 = next_pos_B1 + 1
    return rows


def keep_finished(prefix_cache: PrefixCache, cache, mask_BP, prompts, rows: list[Row], live: list[int], last: bool):
    """Hand the prefix cache the rows that finished this step (all live ones at the last step), each with
    the tokens it has fed the model: its prompt and all of its completion but the last token."""
    ended = [(j, [*prompts[i], *rows[i].token_ids[:-1]]) for j, i in enumerate(live) if last or rows[i].done]
    prefix_cache.keep(cache, mask_BP, ended)


def decode_step(model: torch.nn.Module, cache, token_B, mask_BP, next_pos_B1) -> torch.Tensor:
    """Feed each row's newest token: logits_BV of the next one."""
    return model(
        input_ids=token_B[:, None],
        attention_mask=mask_BP,
        position_ids=next_pos_B1,
        **cache_kwarg(model, cache),
        use_cache=True,
    ).logits[:, -1]


def next_tokens(logits_BV: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator, top_k: int):
    """(token_B, logprob_B, top): one token per row, its logprob, and, when top_k > 0, topk's (values_BK,
    ids_BK) of the same temperature-scaled distribution (None otherwise: no cost)."""
    logprobs_BV = scaled_logprobs(logits_BV, temperature)
    token_B = draw(logprobs_BV, temperature, top_p, generator)
    top = logprobs_BV.topk(top_k, -1) if top_k else None
    return token_B, logprobs_BV.gather(-1, token_B[:, None]).squeeze(-1), top


def processed_logits(
    logits_BV: torch.Tensor, n: int, sampling: SamplingSettings, stop_ids_S: torch.Tensor, seen_BV
) -> torch.Tensor:
    """Step n's logits (every live row has generated n tokens) after min_tokens and repetition penalty."""
    logits_BV = logits_BV.float()
    if n < sampling.min_tokens:
        num_generated_B = torch.full((logits_BV.shape[0],), n, device=logits_BV.device)
        logits_BV = apply_min_tokens(logits_BV, num_generated_B, sampling.min_tokens, stop_ids_S)
    if seen_BV is not None:
        logits_BV = apply_repetition_penalty(logits_BV, seen_BV, sampling.repetition_penalty)
    return logits_BV


def record(
    rows: list[Row],
    live: list[int],
    token_B: torch.Tensor,
    logprob_B: torch.Tensor,
    top,
    stop_token_ids: set[int],
    sampling: SamplingSettings,
    decode,
    options: ServingOptions | None,
    first_index: int,
) -> None:
    """Append one step's tokens (and top logprobs, `top` = topk's (values_BK, ids_BK)) to the live rows,
    mark the rows that stopped, and hand the new tokens to options.on_tokens."""
    tops = None if top is None else [list(zip(i, v)) for i, v in zip(top[1].tolist(), top[0].tolist())]
    on_tokens = options.on_tokens if options is not None else None
    new = []
    for j, (i, tok, lp) in enumerate(zip(live, token_B.tolist(), logprob_B.tolist())):
        row = rows[i]
        row.token_ids.append(tok)
        row.logprobs.append(lp)
        if tops is not None:
            row.top_logprobs.append(tops[j])
        row.done = tok in stop_token_ids or stop_string_ended(row, sampling, decode)
        if on_tokens is not None:
            new.append(NewTokens(first_index + i, [tok], [lp], None if tops is None else [tops[j]]))
    if new:
        on_tokens(new)


def prefill(
    model: torch.nn.Module, prompts: list[list[int]], pad_token_id: int, device, prefix_cache: PrefixCache | None = None
):
    """Run the prompts through the model once, left-padded: (input_ids_BP, mask_BP, positions_BP, KV
    cache, last-position logits_BV).

    Each distinct prompt is computed once and its cache rows copied to its repeats (a GRPO batch is G
    copies of each prompt); the LM head runs on the last position only (`logits_to_keep=1`). Both are
    exact: the rows of a repeated prompt are the same numbers.

    With a `prefix_cache` (grpokit.inference.prefix_cache.PrefixCache), a prompt's first k tokens that
    are cached are not run: row i is [C - k_i holes, its k_i cached tokens | N - n_i holes, its n_i new
    tokens], C = max k_i, N = max n_i, the first C columns' keys and values taken from the cache, holes
    masked like padding; the P = C + N columns of the returned tensors describe the whole row. Without
    a hit (C = 0) this is the plain left-padded prefill.
    """
    from transformers import DynamicCache

    rows: dict[tuple[int, ...], int] = {}
    row_B = torch.tensor([rows.setdefault(tuple(ids), len(rows)) for ids in prompts], device=device)
    distinct = [list(ids) for ids in rows]
    hits = [prefix_cache.lookup(ids) for ids in distinct] if prefix_cache is not None else [(0, None)] * len(rows)
    c = max(k for k, _ in hits)
    n = max(len(ids) - k for ids, (k, _) in zip(distinct, hits))
    layouts = [row_layout(ids, k, c, n, pad_token_id) for ids, (k, _) in zip(distinct, hits)]
    input_ids_UP, mask_UP, positions_UP = (torch.tensor(x, dtype=torch.long, device=device) for x in zip(*layouts))
    if prefix_cache is not None:
        prefix_cache.computed_tokens += sum(len(ids) - k for ids, (k, _) in zip(distinct, hits))
        prefix_cache.reused_tokens += sum(k for k, _ in hits)
    cache = prefix_cache.past(hits, c) if c else DynamicCache()
    logits_UV = model(
        input_ids=input_ids_UP[:, c:],
        attention_mask=mask_UP,
        position_ids=positions_UP[:, c:],
        **cache_kwarg(model, cache),
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]
    if len(distinct) < len(prompts):
        cache.reorder_cache(row_B)  # index_select along the batch: each prompt's rows to its repeats
    return input_ids_UP[row_B], mask_UP[row_B], positions_UP[row_B], cache, logits_UV[row_B]


def row_layout(ids: list[int], k: int, c: int, n: int, pad_token_id: int) -> tuple[list[int], list[int], list[int]]:
    """(input ids, mask, positions) of one prompt whose first k tokens are cached, in c + n columns:
    [c - k holes, k cached | n - new holes, the new tokens]. Holes are padding (mask 0, position 0)."""
    new = len(ids) - k
    holes = [0] * (c - k), [0] * (n - new)
    return (
        [pad_token_id] * (c - k) + ids[:k] + [pad_token_id] * (n - new) + ids[k:],
        holes[0] + [1] * k + holes[1] + [1] * new,
        holes[0] + list(range(k)) + holes[1] + list(range(k, len(ids))),
    )


def stop_string_ended(row: Row, sampling: SamplingSettings, decode) -> bool:
    """Whether the row's latest token completed a new stop string, counting only once min_tokens are
    reached. `row.stop_strings_seen` holds the occurrences in its text before that token."""
    if not (sampling.stop and decode):
        return False
    text = decode(row.token_ids)
    count = sum(text.count(s) for s in sampling.stop)
    new, row.stop_strings_seen = count > row.stop_strings_seen, count
    return new and len(row.token_ids) >= sampling.min_tokens


@functools.cache
def _cache_parameter(forward) -> str:
    """The name under which the model's forward takes its KV cache: `cache` in transformers >= 5.2x,
    `past_key_values` before (passing the old name to a new version warns on every decoding step)."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def cache_kwarg(model: torch.nn.Module, cache) -> dict:
    """`{name: cache}` for the model's forward (a peft wrapper passes its keyword arguments through)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_cache_parameter(type(base).forward): cache}
