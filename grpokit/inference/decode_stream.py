"""The builtin engine's streaming decode loop (plain path): rows join and leave a running batch between
decode steps, and new weights load between two decode steps (grpokit.inference.streams).

It runs the plain sampler's steps (grpokit.inference.sampler: prefill, processed logits, draw, record,
finished rows leave the batch and the KV cache) over a batch that changes:

- **Admission.** Queued groups are admitted while the batch has fewer than `max_rows` rows (a group
  whole, and at least one group into an empty batch). Their prompts are prefilled on their own, and
  their KV cache, mask and next-token logits are appended to the batch's: the narrower of the two is
  left-padded with masked columns (as the sampler pads prompts), so every row keeps its own positions.
- **Weight updates.** `load_weights` loads the update into the engine, then re-prefills every unfinished
  row with the new weights: `continue` (default) feeds its prompt and its tokens so far, so from there
  on each token's logits are the new weights' over the whole sequence (the KV cache is recomputed, as
  AReaL's interruptible generation does, not carried stale); `regenerate` drops its tokens and starts
  it again from its prompt. Each token records the weight step of the forward that produced its logits
  (Completion.token_steps), so a rollout spanning an update has both steps on its tokens and each
  token's logprob is that of its own weights.
- **Sampling.** One generator for the stream, seeded with a group's `seed` when it is admitted into an
  idle stream; min_tokens counts each row's own tokens. Admitted together into an idle stream, groups
  decode exactly as `generate` decodes them (same prefill, same steps, same draws).
- **Images.** A group whose prompt holds images is never admitted into the batch: the advance that finds
  it queued samples it whole on its own (grpokit.inference.image_rows), with a generator of its own
  seeded `seed * SEED_STRIDE + k` for the stream's k-th image group, and returns it with the others.

Shape legend: B rows in the batch, W columns of the KV cache, V vocabulary, S stop token ids.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from grpokit.inference import Completion, SamplingSettings
from grpokit.inference.image_rows import SEED_STRIDE, sample_image_group
from grpokit.inference.logits_processors import apply_min_tokens, apply_repetition_penalty, mark_seen, seen_tokens
from grpokit.inference.prefix_cache import _plain_layers
from grpokit.inference.sampler import Row, decode_step, next_tokens, prefill, stop_string_ended
from grpokit.inference.streams import FinishedGroup, GenerationStream, GroupRequest


@dataclass
class _Group:
    request: GroupRequest
    rows: list[StreamRow] = field(default_factory=list)
    ended: int = 0


@dataclass
class StreamRow:
    """One completion in the stream: its group, its prompt, what it has sampled, with which weights."""

    group: _Group
    prompt_ids: list[int]
    row: Row = field(default_factory=Row)
    token_steps: list[int] = field(default_factory=list)
    ended: bool = False


@dataclass
class _Batch:
    """The decoding rows' tensors, in the order of DecodeStream.rows."""

    cache: object
    mask_BW: torch.Tensor
    next_pos_B1: torch.Tensor
    logits_BV: torch.Tensor
    logits_step_B: list[int]  # the weight step whose forward computed each row's next-token logits
    seen_BV: torch.Tensor | None


class DecodeStream(GenerationStream):
    """BuiltinEngine's plain-path GenerationStream (see the module docstring)."""

    takes_images = True

    def __init__(self, engine, sampling: SamplingSettings, max_rows: int, on_update: str = "continue") -> None:
        super().__init__(engine, sampling, max_rows)
        if on_update not in ("continue", "regenerate"):
            raise ValueError(f"on_update must be 'continue' or 'regenerate', got {on_update!r}")
        self.on_update = on_update
        self.stop_token_ids = engine._stop_token_ids(sampling)
        self.device = engine.device
        self.stop_ids_S = torch.tensor(sorted(self.stop_token_ids), dtype=torch.long, device=self.device)
        self.temperature = 1.0 if sampling.temperature is None else sampling.temperature
        self.generator = torch.Generator(device=self.device).manual_seed(sampling.seed or 0)
        self.rows: list[StreamRow] = []
        self.batch: _Batch | None = None
        self.groups = 0  # admitted and not yet returned
        self.decode_steps = self.decoded_rows = 0  # counters: occupancy = decoded_rows / (decode_steps x max_rows)
        self.image_groups = 0  # groups with images sampled so far (each one's generator seed)

    @property
    def inflight(self) -> int:
        return len(self.queue) + self.groups

    @torch.no_grad()
    def advance(self) -> list[FinishedGroup]:
        with self._weights():
            images = self._image_groups()
            self._admit()
            if not self.rows:
                return images
            return images + self._step()

    @torch.no_grad()
    def load_weights(self, update) -> None:
        self.engine.load_weights(update)
        if not self.rows:
            return
        if self.on_update == "regenerate":
            for r in self.rows:
                r.row, r.token_steps = Row(), []
        with self._weights():
            sequences = [r.prompt_ids + r.row.token_ids for r in self.rows]
            self.batch = self._prefilled(sequences)

    def close(self) -> None:
        super().close()
        self.rows, self.batch, self.groups = [], None, 0

    # --- the loop ---------------------------------------------------------------------------------

    def _admit(self) -> None:
        admitted: list[GroupRequest] = []
        while self.queue and (
            (not self.rows and not admitted)
            or len(self.rows) + sum(r.n for r in admitted) + self.queue[0].n <= self.max_rows
        ):
            admitted.append(self.queue.popleft())
        if not admitted:
            return
        if not self.rows and admitted[0].seed is not None:  # an idle stream: sample as generate would
            self.generator.manual_seed(admitted[0].seed)
        new = []
        for request in admitted:
            group = _Group(request)
            group.rows = [StreamRow(group, list(request.prompt_ids)) for _ in range(request.n)]
            new += group.rows
        self.groups += len(admitted)
        batch = self._prefilled([r.prompt_ids for r in new])
        self.batch = batch if self.batch is None else _joined(self.batch, batch)
        self.rows += new

    def _image_groups(self) -> list[FinishedGroup]:
        """The queued groups whose prompt holds images, each sampled whole on its own (module docstring)."""
        taken = [r for r in self.queue if r.vision]
        if not taken:
            return []
        self.queue = type(self.queue)(r for r in self.queue if not r.vision)
        out = []
        for request in taken:
            seed = request.seed if request.seed is not None else self.sampling.seed or 0
            generator = torch.Generator(device=self.device).manual_seed(seed * SEED_STRIDE + self.image_groups)
            self.image_groups += 1
            out.append(FinishedGroup(request, sample_image_group(self.engine, request, self.sampling, generator)))
        return out

    def _step(self) -> list[FinishedGroup]:
        b, sampling = self.batch, self.sampling
        self.decode_steps += 1
        self.decoded_rows += len(self.rows)
        logits_BV = b.logits_BV.float()
        if sampling.min_tokens:
            counts_B = torch.tensor([len(r.row.token_ids) for r in self.rows], device=self.device)
            logits_BV = apply_min_tokens(logits_BV, counts_B, sampling.min_tokens, self.stop_ids_S)
        if b.seen_BV is not None:
            logits_BV = apply_repetition_penalty(logits_BV, b.seen_BV, sampling.repetition_penalty)
        token_B, logprob_B, _ = next_tokens(logits_BV, self.temperature, sampling.top_p, self.generator, 0)
        if b.seen_BV is not None:
            mark_seen(b.seen_BV, token_B)
        decode = self.engine.tokenizer.decode
        for r, tok, lp, step in zip(self.rows, token_B.tolist(), logprob_B.tolist(), b.logits_step_B):
            r.row.token_ids.append(tok)
            r.row.logprobs.append(lp)
            r.token_steps.append(step)
            r.row.done = tok in self.stop_token_ids or stop_string_ended(r.row, sampling, decode)
            r.ended = r.row.done or len(r.row.token_ids) >= (r.group.request.max_tokens or sampling.max_tokens)
        cache = self.engine.prefix_cache
        if cache.enabled:  # each row that ended, with what it fed the model: its prompt, all but its last token
            ended = [(j, [*r.prompt_ids, *r.row.token_ids[:-1]]) for j, r in enumerate(self.rows) if r.ended]
            cache.keep(b.cache, b.mask_BW, ended)
        finished = self._finished()
        live = [j for j, r in enumerate(self.rows) if not r.ended]
        if not live:
            self.rows, self.batch = [], None
            return finished
        if len(live) < len(self.rows):
            rows_B = torch.tensor(live, device=self.device)
            b.cache.reorder_cache(rows_B)
            token_B, b.mask_BW, b.next_pos_B1 = token_B[rows_B], b.mask_BW[rows_B], b.next_pos_B1[rows_B]
            b.seen_BV = b.seen_BV[rows_B] if b.seen_BV is not None else None
            self.rows = [self.rows[j] for j in live]
        b.mask_BW = torch.cat([b.mask_BW, torch.ones((len(live), 1), dtype=b.mask_BW.dtype, device=self.device)], 1)
        b.logits_BV = decode_step(self.engine.model, b.cache, token_B, b.mask_BW, b.next_pos_B1)
        b.next_pos_B1 = b.next_pos_B1 + 1
        b.logits_step_B = [self.engine.weight_step] * len(live)
        return finished

    def _finished(self) -> list[FinishedGroup]:
        out = []
        for r in self.rows:
            if not r.ended:
                continue
            r.group.ended += 1
            if r.group.ended == r.group.request.n:
                completions = [
                    Completion.from_steps(x.row.token_ids, x.row.logprobs, not x.row.done, x.token_steps)
                    for x in r.group.rows
                ]
                out.append(FinishedGroup(r.group.request, completions))
        self.groups -= len(out)
        return out

    def _prefilled(self, sequences: list[list[int]]) -> _Batch:
        engine = self.engine
        input_ids_BP, mask_BP, positions_BP, cache, logits_BV = prefill(
            engine.model, sequences, engine.tokenizer.pad_token_id, self.device, engine.prefix_cache
        )
        if _plain_layers(cache) is None:
            raise RuntimeError(
                "streaming needs a plain full-attention KV cache (BuiltinEngine plain path); this model's is not"
            )
        seen_BV = None
        if self.sampling.repetition_penalty != 1.0:
            seen_BV = seen_tokens(input_ids_BP, mask_BP.bool(), logits_BV.shape[-1])
        steps = [engine.weight_step] * len(sequences)
        return _Batch(cache, mask_BP, positions_BP[:, -1:] + 1, logits_BV, steps, seen_BV)

    def _weights(self):
        """The engine's sampling weights for a forward (its merged LoRA copies when it has them)."""
        self.engine.prefix_cache.follow_weights(self.engine.model)
        merged = self.engine.merged
        return merged.active() if merged is not None else contextlib.nullcontext()


def _joined(a: _Batch, b: _Batch) -> _Batch:
    """The rows of `a` then `b` in one batch: the narrower cache and mask left-padded with masked columns."""
    from transformers import DynamicCache

    width = max(a.mask_BW.shape[1], b.mask_BW.shape[1])
    layers_a, layers_b = _plain_layers(a.cache), _plain_layers(b.cache)
    cache = DynamicCache()
    for i, (la, lb) in enumerate(zip(layers_a, layers_b)):
        keys = torch.cat([_left_pad(la.keys, width), _left_pad(lb.keys, width)])
        values = torch.cat([_left_pad(la.values, width), _left_pad(lb.values, width)])
        cache.update(keys, values, i)
    mask = torch.cat([_left_pad(a.mask_BW, width, dim=1), _left_pad(b.mask_BW, width, dim=1)])
    seen = None if a.seen_BV is None else torch.cat([a.seen_BV, b.seen_BV])
    return _Batch(
        cache,
        mask,
        torch.cat([a.next_pos_B1, b.next_pos_B1]),
        torch.cat([a.logits_BV, b.logits_BV]),
        a.logits_step_B + b.logits_step_B,
        seen,
    )


def _left_pad(t: torch.Tensor, width: int, dim: int = -2) -> torch.Tensor:
    """`t` with zeros prepended along `dim` up to `width` (keys/values: [B, H, W, D]; mask: [B, W])."""
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)
