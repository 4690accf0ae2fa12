"""Continuous batching over a ModelRunner's slots, with the per-step bookkeeping kept on the device.

Every request waits in a queue; a free slot takes the next one (its prompt is prefilled into the slot's
cache row) while the other slots keep decoding, so a batch with uneven completion lengths keeps the GPU
busy instead of idling until its longest member ends.

Why the bookkeeping lives on the device: a decode step replayed from a CUDA graph takes a few
milliseconds of GPU time and almost no CPU time, so a Python loop that reads every sampled token back
(a host sync) and appends it to lists per slot would leave the GPU idle for a large part of each step.
Here sampled tokens, their logprobs, each slot's token count and the index of its first stop token
are written into device tensors, and the next step's inputs are updated in place; the host looks
(one small copy) only every `sync_every` steps, or exactly when its own count says a slot reaches
max_tokens. A slot that stopped between looks decodes a few wasted tokens, which are cut at its stop
index. At a look, finished slots are read out and refilled; refills are grouped (at least `refill_min`
free slots, or nothing left decoding) because a prefill is an eager forward that costs about as much
as several replayed decode steps.

Sampling: min_tokens and repetition penalty (grpokit.inference.logits_processors) then the Gumbel-max
sampler (grpokit.inference.fast.sampling), all batched on the device.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import torch

from grpokit.inference import SamplingSettings
from grpokit.inference.fast.runner import ModelRunner
from grpokit.inference.fast.sampling import sample_tokens
from grpokit.inference.logits_processors import apply_min_tokens, apply_repetition_penalty, seen_tokens


class _SlotState:
    """Device tensors per slot: generated tokens/logprobs, counts, first stop index, busy flag."""

    def __init__(
        self, runner: ModelRunner, sampling: SamplingSettings, stop_token_ids: set[int], sync_every: int
    ) -> None:
        n, dev = runner.num_slots, runner.device
        self.width = sampling.max_tokens + sync_every + 1  # the last column takes writes of idle rows
        self.tokens_BN = torch.zeros((n, self.width), dtype=torch.long, device=dev)
        self.logprobs_BN = torch.zeros((n, self.width), dtype=torch.float32, device=dev)
        self.count_B = torch.zeros(n, dtype=torch.long, device=dev)
        self.stop_at_B = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.busy_B = torch.zeros(n, dtype=torch.bool, device=dev)
        self.stop_ids_S = torch.tensor(sorted(stop_token_ids), dtype=torch.long, device=dev)
        vocab = runner.logits_BV.shape[-1]
        self.seen_BV = (
            torch.zeros((n, vocab), dtype=torch.bool, device=dev) if sampling.repetition_penalty != 1.0 else None
        )


def generate_continuous(  # noqa: C901 - one CUDA-only decode loop (slots, graphs, stops); untested here, left whole
    runner: ModelRunner,
    prompts: list[list[int]],
    sampling: SamplingSettings,
    stop_token_ids: set[int],
    generator: torch.Generator,
    decode=None,
    refill_min: int | None = None,
    max_prefill_tokens: int = 32768,
    sync_every: int = 8,
    cancelled: Callable[[], bool] | None = None,
    on_done: Callable[[int, list[int], list[float]], None] | None = None,
) -> list[tuple[list[int], list[float], bool] | None]:
    """Sample one completion per prompt: (token ids, logprobs, is_truncated), in prompt order.

    A completion ends at its first stop token (kept), when `decode` of its tokens gains a stop string
    (kept; checked at each look, from min_tokens on), at sampling.max_tokens, or when its slot's cache
    is full (both count as truncated). `on_done(i, tokens, logprobs)` is told of completion i as it
    ends (a streaming server); `cancelled()` true at a look stops the loop, leaving None for every
    completion not finished by then.
    """
    temperature = 1.0 if sampling.temperature is None else sampling.temperature
    num_slots, dev = runner.num_slots, runner.device
    refill_min = refill_min or max(1, num_slots // 8)
    st = _SlotState(runner, sampling, stop_token_ids, sync_every)
    queue = deque(range(len(prompts)))
    slot_request = [-1] * num_slots
    slot_count = [0] * num_slots  # host mirror of count_B (every busy slot gains one token per step)
    results: list[tuple[list[int], list[float], bool] | None] = [None] * len(prompts)
    pick = runner.kernels.gumbel_pick if runner.kernels.compiled else None

    def sample_into(rows_N: torch.Tensor, logits_NV: torch.Tensor, live_N: torch.Tensor) -> torch.Tensor:
        """Sample for `rows_N`, record tokens where live_N, advance counts; return the sampled tokens."""
        count_N = st.count_B[rows_N]
        if sampling.min_tokens or st.seen_BV is not None or pick is None:
            logits_NV = logits_NV.float()
        if sampling.min_tokens:
            logits_NV = apply_min_tokens(logits_NV, count_N, sampling.min_tokens, st.stop_ids_S)
        if st.seen_BV is not None:
            logits_NV = apply_repetition_penalty(logits_NV, st.seen_BV[rows_N], sampling.repetition_penalty)
        token_N, logprob_N = sample_tokens(logits_NV, temperature, sampling.top_p, generator, pick)
        column_N = torch.where(live_N, count_N.clamp(max=st.width - 2), st.width - 1)
        st.tokens_BN[rows_N, column_N] = token_N
        st.logprobs_BN[rows_N, column_N] = logprob_N
        first_stop_N = live_N & (st.stop_at_B[rows_N] < 0) & torch.isin(token_N, st.stop_ids_S)
        st.stop_at_B[rows_N] = torch.where(first_stop_N, count_N, st.stop_at_B[rows_N])
        st.count_B[rows_N] = count_N + live_N.long()
        if st.seen_BV is not None:
            st.seen_BV[rows_N, token_N] |= live_N
        return token_N

    def prefill(slots: list[int]) -> None:
        rows_N = torch.tensor(slots, device=dev)
        group = [prompts[slot_request[s]] for s in slots]
        logits_NV = runner.prefill(group, slots)
        st.count_B[rows_N] = 0
        st.stop_at_B[rows_N] = -1
        st.busy_B[rows_N] = True
        if st.seen_BV is not None:
            ids = torch.zeros((len(group), max(map(len, group))), dtype=torch.long)
            for i, p in enumerate(group):
                ids[i, : len(p)] = torch.tensor(p)
            valid = torch.arange(ids.shape[1])[None] < torch.tensor([len(p) for p in group])[:, None]
            st.seen_BV[rows_N] = seen_tokens(ids.to(dev), valid.to(dev), st.seen_BV.shape[1])
        token_N = sample_into(rows_N, logits_NV, torch.ones(len(slots), dtype=torch.bool, device=dev))
        runner.tokens_B[rows_N] = token_N
        runner.positions_B[rows_N] = torch.tensor([len(p) for p in group], device=dev)
        for s in slots:
            slot_count[s] = 1

    def look() -> None:
        """Read out and free every slot whose completion ended."""
        busy = [s for s in range(num_slots) if slot_request[s] >= 0]
        if not busy:
            return
        rows = torch.tensor(busy, device=dev)
        stop_at = st.stop_at_B[rows].tolist()
        tokens_host = st.tokens_BN[rows].tolist() if (sampling.stop and decode) else None
        done = []
        for i, s in enumerate(busy):
            r = slot_request[s]
            n = stop_at[i] + 1 if stop_at[i] >= 0 else min(slot_count[s], sampling.max_tokens)
            stopped = stop_at[i] >= 0
            if tokens_host is not None:
                hit = _stop_string_end(tokens_host[i][:n], sampling, decode)
                if hit is not None:
                    n, stopped = hit, True
            cache_full = len(prompts[r]) + n >= runner.max_len
            if stopped or n >= sampling.max_tokens or cache_full:
                done.append((s, r, n, not stopped))
        if not done:
            return
        rows = torch.tensor([s for s, *_ in done], device=dev)
        tokens_out, logprobs_out = st.tokens_BN[rows].tolist(), st.logprobs_BN[rows].tolist()
        st.busy_B[rows] = False
        for i, (s, r, n, truncated) in enumerate(done):
            results[r] = (tokens_out[i][:n], logprobs_out[i][:n], truncated)
            slot_request[s] = -1
            if on_done is not None:
                on_done(r, *results[r][:2])

    while queue or any(r >= 0 for r in slot_request):
        look()
        if cancelled is not None and cancelled():
            break
        free = [s for s in range(num_slots) if slot_request[s] < 0]
        if queue and free and (len(free) == num_slots or len(free) >= min(refill_min, len(queue))):
            take, budget = [], max_prefill_tokens
            while queue and len(take) < len(free) and (not take or budget >= len(prompts[queue[0]])):
                budget -= len(prompts[queue[0]])
                slot_request[free[len(take)]] = queue.popleft()
                take.append(free[len(take)])
            prefill(take)
        busy = [s for s in range(num_slots) if slot_request[s] >= 0]
        if not busy:
            continue
        # decode until the next look: sync_every steps, or until a slot reaches max_tokens or a full cache
        room = min(
            min(sampling.max_tokens - slot_count[s] for s in busy),
            min(runner.max_len - 1 - (len(prompts[slot_request[s]]) + slot_count[s] - 1) for s in busy),
        )
        width = busy[-1] + 1
        for _ in range(max(0, min(sync_every, room))):
            max_position = max(len(prompts[slot_request[s]]) + slot_count[s] - 1 for s in busy)
            b, s_len = runner.bucket(width, max_position)
            logits_BV = runner.step(b, s_len)
            live_B = st.busy_B[:b]
            rows_B = torch.arange(b, device=dev)
            token_B = sample_into(rows_B, logits_BV, live_B)
            runner.tokens_B[:b] = torch.where(live_B, token_B, runner.tokens_B[:b])
            runner.positions_B[:b] = torch.where(
                live_B, (runner.positions_B[:b] + 1).clamp(max=runner.max_len - 1), runner.positions_B[:b]
            )
            for s in busy:
                slot_count[s] += 1
    return results  # type: ignore[return-value]


def _stop_string_end(tokens: list[int], sampling: SamplingSettings, decode) -> int | None:
    """Smallest n >= min_tokens such that decode(tokens[:n]) contains a stop string, else None."""
    text = decode(tokens)
    if not any(s in text for s in sampling.stop):
        return None
    for n in range(max(1, sampling.min_tokens), len(tokens) + 1):
        if any(s in decode(tokens[:n]) for s in sampling.stop):
            return n
    return None
