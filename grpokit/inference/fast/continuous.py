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


def generate_continuous(
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
    batch = ContinuousBatch(runner, sampling, stop_token_ids, generator, decode, refill_min, max_prefill_tokens)
    batch.sync_every, batch.on_done = sync_every, on_done
    batch.add(prompts)
    while batch.active:
        if not batch.advance(cancelled):
            break
    return batch.results  # type: ignore[return-value]


class ContinuousBatch:
    """The slots' decode loop as an object: `add` requests, `advance` (a look, refills, up to sync_every
    decode steps) until none is `active`; `restart_live` re-prefills the unfinished requests (after a
    weight update, grpokit.inference.fast.stream). `results[i]` is request i's (tokens, logprobs,
    is_truncated) once it ended; `weight_steps[i]` its (token index, weight step) boundaries."""

    def __init__(
        self,
        runner: ModelRunner,
        sampling: SamplingSettings,
        stop_token_ids: set[int],
        generator: torch.Generator,
        decode=None,
        refill_min: int | None = None,
        max_prefill_tokens: int = 32768,
        sync_every: int = 8,
    ) -> None:
        self.runner, self.sampling, self.generator, self.decode = runner, sampling, generator, decode
        self.temperature = 1.0 if sampling.temperature is None else sampling.temperature
        self.refill_min = refill_min or max(1, runner.num_slots // 8)
        self.max_prefill_tokens, self.sync_every = max_prefill_tokens, sync_every
        self.st = _SlotState(runner, sampling, stop_token_ids, sync_every)
        self.queue: deque[int] = deque()
        self.prompts: list[list[int]] = []
        self.results: list[tuple[list[int], list[float], bool] | None] = []
        self.weight_steps: list[list[tuple[int, int]]] = []
        self.caps: list[int] = []  # each request's max_tokens (at most sampling.max_tokens)
        self.slot_request = [-1] * runner.num_slots
        self.slot_count = [0] * runner.num_slots  # host mirror of count_B (every busy slot gains one token per step)
        self.pick = runner.kernels.gumbel_pick if runner.kernels.compiled else None
        self.on_done: Callable[[int, list[int], list[float]], None] | None = None
        self.weight_step = 0  # recorded on each request's tokens from here on
        self.decode_steps = self.decoded_rows = 0  # counters: busy slots summed over decode steps

    @property
    def active(self) -> bool:
        return bool(self.queue) or any(r >= 0 for r in self.slot_request)

    def add(self, prompts: list[list[int]], max_tokens: int | None = None) -> list[int]:
        """Queue requests (capped at `max_tokens`, at most sampling.max_tokens); returns their indices."""
        cap = min(max_tokens or self.sampling.max_tokens, self.sampling.max_tokens)
        first = len(self.prompts)
        self.caps += [cap] * len(prompts)
        self.prompts += [list(p) for p in prompts]
        self.results += [None] * len(prompts)
        self.weight_steps += [[] for _ in prompts]
        self.queue.extend(range(first, len(self.prompts)))
        return list(range(first, len(self.prompts)))

    def advance(self, cancelled: Callable[[], bool] | None = None) -> bool:
        """A look (finished requests read out), refills, then decode until the next look; False when
        `cancelled()` stopped it at the look."""
        self.look()
        if cancelled is not None and cancelled():
            return False
        runner, num_slots = self.runner, self.runner.num_slots
        free = [s for s in range(num_slots) if self.slot_request[s] < 0]
        queue = self.queue
        if queue and free and (len(free) == num_slots or len(free) >= min(self.refill_min, len(queue))):
            take, budget = [], self.max_prefill_tokens
            while queue and len(take) < len(free) and (not take or budget >= len(self.prompts[queue[0]])):
                budget -= len(self.prompts[queue[0]])
                self.slot_request[free[len(take)]] = queue.popleft()
                take.append(free[len(take)])
            self._prefill(take, [self.prompts[self.slot_request[s]] for s in take], [0] * len(take))
        busy = [s for s in range(num_slots) if self.slot_request[s] >= 0]
        if not busy:
            return True
        # decode until the next look: sync_every steps, or until a slot reaches max_tokens or a full cache
        lengths = {s: len(self.prompts[self.slot_request[s]]) for s in busy}
        room = min(
            min(self.caps[self.slot_request[s]] - self.slot_count[s] for s in busy),
            min(runner.max_len - 1 - (lengths[s] + self.slot_count[s] - 1) for s in busy),
        )
        st, dev, width = self.st, runner.device, busy[-1] + 1
        for _ in range(max(0, min(self.sync_every, room))):
            max_position = max(lengths[s] + self.slot_count[s] - 1 for s in busy)
            b, s_len = runner.bucket(width, max_position)
            logits_BV = runner.step(b, s_len)
            live_B = st.busy_B[:b]
            token_B = self._sample_into(torch.arange(b, device=dev), logits_BV, live_B)
            runner.tokens_B[:b] = torch.where(live_B, token_B, runner.tokens_B[:b])
            runner.positions_B[:b] = torch.where(
                live_B, (runner.positions_B[:b] + 1).clamp(max=runner.max_len - 1), runner.positions_B[:b]
            )
            for s in busy:
                self.slot_count[s] += 1
            self.decode_steps += 1
            self.decoded_rows += len(busy)
        return True

    def restart_live(self, keep_tokens: bool = True) -> None:
        """Re-prefill every unfinished request with the weights loaded now: its prompt and tokens so far
        (`keep_tokens`; its next token is the new weights') or its prompt alone (it starts over)."""
        self.look()
        busy = [s for s in range(self.runner.num_slots) if self.slot_request[s] >= 0]
        if not busy:
            return
        counts = [self.slot_count[s] if keep_tokens else 0 for s in busy]
        rows = torch.tensor(busy, device=self.runner.device)
        held = self.st.tokens_BN[rows].tolist()
        sequences = [self.prompts[self.slot_request[s]] + held[i][: counts[i]] for i, s in enumerate(busy)]
        self._prefill(busy, sequences, counts)

    def _sample_into(self, rows_N: torch.Tensor, logits_NV: torch.Tensor, live_N: torch.Tensor) -> torch.Tensor:
        """Sample for `rows_N`, record tokens where live_N, advance counts; return the sampled tokens."""
        st, sampling = self.st, self.sampling
        count_N = st.count_B[rows_N]
        if sampling.min_tokens or st.seen_BV is not None or self.pick is None:
            logits_NV = logits_NV.float()
        if sampling.min_tokens:
            logits_NV = apply_min_tokens(logits_NV, count_N, sampling.min_tokens, st.stop_ids_S)
        if st.seen_BV is not None:
            logits_NV = apply_repetition_penalty(logits_NV, st.seen_BV[rows_N], sampling.repetition_penalty)
        token_N, logprob_N = sample_tokens(logits_NV, self.temperature, sampling.top_p, self.generator, self.pick)
        column_N = torch.where(live_N, count_N.clamp(max=st.width - 2), st.width - 1)
        st.tokens_BN[rows_N, column_N] = token_N
        st.logprobs_BN[rows_N, column_N] = logprob_N
        first_stop_N = live_N & (st.stop_at_B[rows_N] < 0) & torch.isin(token_N, st.stop_ids_S)
        st.stop_at_B[rows_N] = torch.where(first_stop_N, count_N, st.stop_at_B[rows_N])
        st.count_B[rows_N] = count_N + live_N.long()
        if st.seen_BV is not None:
            st.seen_BV[rows_N, token_N] |= live_N
        return token_N

    def _prefill(self, slots: list[int], sequences: list[list[int]], counts: list[int]) -> None:
        """Run `sequences` into the slots' cache rows and sample each slot's next token, its count-th
        (0 for a new request; a restarted one keeps the tokens it has)."""
        st, runner, dev = self.st, self.runner, self.runner.device
        rows_N = torch.tensor(slots, device=dev)
        logits_NV = runner.prefill(sequences, slots)
        st.count_B[rows_N] = torch.tensor(counts, device=dev)
        st.stop_at_B[rows_N] = -1
        st.busy_B[rows_N] = True
        if st.seen_BV is not None:
            ids = torch.zeros((len(sequences), max(map(len, sequences))), dtype=torch.long)
            for i, p in enumerate(sequences):
                ids[i, : len(p)] = torch.tensor(p)
            valid = torch.arange(ids.shape[1])[None] < torch.tensor([len(p) for p in sequences])[:, None]
            st.seen_BV[rows_N] = seen_tokens(ids.to(dev), valid.to(dev), st.seen_BV.shape[1])
        token_N = self._sample_into(rows_N, logits_NV, torch.ones(len(slots), dtype=torch.bool, device=dev))
        runner.tokens_B[rows_N] = token_N
        runner.positions_B[rows_N] = torch.tensor([len(p) for p in sequences], device=dev)
        for s, count in zip(slots, counts):
            self.slot_count[s] = count + 1
            steps = self.weight_steps[self.slot_request[s]]
            if count == 0:
                steps.clear()
            steps.append((count, self.weight_step))

    def look(self) -> None:
        """Read out and free every slot whose completion ended."""
        sampling, st, dev = self.sampling, self.st, self.runner.device
        busy = [s for s in range(self.runner.num_slots) if self.slot_request[s] >= 0]
        if not busy:
            return
        rows = torch.tensor(busy, device=dev)
        stop_at = st.stop_at_B[rows].tolist()
        tokens_host = st.tokens_BN[rows].tolist() if (sampling.stop and self.decode) else None
        done = []
        for i, s in enumerate(busy):
            r = self.slot_request[s]
            cap = self.caps[r]
            n = stop_at[i] + 1 if stop_at[i] >= 0 else min(self.slot_count[s], cap)
            stopped = stop_at[i] >= 0
            if tokens_host is not None:
                hit = _stop_string_end(tokens_host[i][:n], sampling, self.decode)
                if hit is not None:
                    n, stopped = hit, True
            cache_full = len(self.prompts[r]) + n >= self.runner.max_len
            if stopped or n >= cap or cache_full:
                done.append((s, r, n, not stopped))
        if not done:
            return
        rows = torch.tensor([s for s, *_ in done], device=dev)
        tokens_out, logprobs_out = st.tokens_BN[rows].tolist(), st.logprobs_BN[rows].tolist()
        st.busy_B[rows] = False
        self.runner.positions_B[rows] = 0  # a freed row is still decoded (masked): keep it inside the cache
        for i, (s, r, n, truncated) in enumerate(done):
            self.results[r] = (tokens_out[i][:n], logprobs_out[i][:n], truncated)
            self.slot_request[s] = -1
            if self.on_done is not None:
                self.on_done(r, *self.results[r][:2])


def _stop_string_end(tokens: list[int], sampling: SamplingSettings, decode) -> int | None:
    """Smallest n >= min_tokens such that decode(tokens[:n]) contains a stop string, else None."""
    text = decode(tokens)
    if not any(s in text for s in sampling.stop):
        return None
    for n in range(max(1, sampling.min_tokens), len(tokens) + 1):
        if any(s in decode(tokens[:n]) for s in sampling.stop):
            return n
    return None
