"""The fast path's GenerationStream (grpokit.inference.streams): groups go into the continuous batch's
queue as they are submitted, slots refill as completions end, and a weight update between two advances
re-prefills the unfinished requests with the new weights.

grpokit.inference.fast.continuous.ContinuousBatch does the work. An advance is one look (finished
requests read out, free slots refilled) and up to `sync_every` decode steps, so an update lands at most
that many decode steps after it was published (the orchestrator polls between advances). On an update the
weights are loaded in place (LoRA adapters into the peft wrapper, full weights by copy; the captured CUDA
graphs read them where they are), then every unfinished request is prefilled again into its slot:
`continue` with its prompt and tokens so far (the KV cache is recomputed, and its next token is the new
weights'), `regenerate` with its prompt alone. Each request keeps (token index, weight step) boundaries,
so each token's weight step is known (Completion.token_steps).

The stream has its own ModelRunner (slots for `max_rows` rows of `max_len` tokens: the longest prompt +
completion the caller will send, data.seq_len for the orchestrator; else the engine's max_model_len), so a
`generate` between two advances (evaluation) cannot overwrite its slots; that is a second KV cache. The
first LoRA update wraps the model in peft, which changes the modules the runner was built on: then the
stream builds a new runner and the unfinished requests start over from their prompts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from grpokit.inference import Completion, SamplingSettings
from grpokit.inference.fast.continuous import ContinuousBatch
from grpokit.inference.fast.runner import LENGTH_BUCKET, ModelRunner
from grpokit.inference.streams import FinishedGroup, GenerationStream, GroupRequest

log = logging.getLogger(__name__)


@dataclass
class _Group:
    request: GroupRequest
    ids: list[int] = field(default_factory=list)  # its requests in the ContinuousBatch


class FastStream(GenerationStream):
    """BuiltinEngine's fast-path GenerationStream (see the module docstring)."""

    def __init__(
        self, engine, sampling: SamplingSettings, max_rows: int, on_update: str = "continue", max_len: int | None = None
    ) -> None:
        if max_rows > engine.max_batch_size:  # the engine's slots are the rows it decodes at once
            log.warning(
                "the stream asks for %d rows in flight, the engine decodes %d at once "
                "(inference.init_args.max_batch_size); the rest wait in its queue: raise max_batch_size "
                "or lower data.streaming.max_inflight",
                max_rows,
                engine.max_batch_size,
            )
        super().__init__(engine, sampling, min(max_rows, engine.max_batch_size))
        self.max_len = min(engine.max_model_len, max_len or engine.max_model_len)
        if on_update not in ("continue", "regenerate"):
            raise ValueError(f"on_update must be 'continue' or 'regenerate', got {on_update!r}")
        self.on_update = on_update
        self.generator = torch.Generator(device=engine.device).manual_seed(sampling.seed or 0)
        self.groups: list[_Group] = []
        # built at the first advance, on the engine's stream and in the sampling thread (not the one that
        # opened the stream, before training put the trainer on the device): see _batch
        self.batch: ContinuousBatch | None = None

    @property
    def inflight(self) -> int:
        return len(self.queue) + len(self.groups)

    @property
    def decode_steps(self) -> int:
        return self.batch.decode_steps if self.batch is not None else 0

    @property
    def decoded_rows(self) -> int:
        return self.batch.decoded_rows if self.batch is not None else 0

    @torch.no_grad()
    def advance(self) -> list[FinishedGroup]:
        with self.engine._own_stream():
            self._batch()
            self._admit()
            if self.batch.active:
                self.batch.advance()
            self.batch.look()
        return self._finished()

    @torch.no_grad()
    def load_weights(self, update) -> None:
        model = self.engine.model
        self.engine.load_weights(update)
        if self.batch is None:
            return  # nothing sampled yet: the batch, once built, starts at the engine's step
        with self.engine._own_stream():
            if self.engine.model is not model:  # peft wrapped the model: the runner's modules are stale
                self._rebuild()
                return
            self.batch.weight_step = update.step
            self.batch.restart_live(keep_tokens=self.on_update == "continue")

    def close(self) -> None:
        super().close()
        self.groups = []
        self.batch = None

    def _batch(self) -> ContinuousBatch:
        """The stream's batch, built on first use: its KV cache then is sized against the memory the
        trainer left, and its graphs are captured in the thread that replays them."""
        if self.batch is None:
            self.batch = self._new_batch()
        return self.batch

    def _new_batch(self) -> ContinuousBatch:
        engine = self.engine
        slots = self.max_rows  # at most engine.max_batch_size (__init__)
        max_len = min(engine.max_model_len, -(-self.max_len // LENGTH_BUCKET) * LENGTH_BUCKET)
        runner = ModelRunner(engine.model, slots, max_len, engine.cuda_graphs, engine.compile)
        batch = ContinuousBatch(
            runner, self.sampling, engine._stop_token_ids(self.sampling), self.generator, engine.tokenizer.decode
        )
        batch.weight_step = engine.weight_step
        return batch

    def _admit(self) -> None:
        """Every submitted group goes into the batch's queue (slots take its rows as they free up); the
        first into an idle batch seeds the sampler with its seed."""
        while self.queue:
            request = self.queue.popleft()
            if not self.batch.active and request.seed is not None:
                self.generator.manual_seed(request.seed)
            ids = self.batch.add([request.prompt_ids] * request.n, request.max_tokens)
            self.groups.append(_Group(request, ids))

    def _finished(self) -> list[FinishedGroup]:
        done = [g for g in self.groups if all(self.batch.results[i] is not None for i in g.ids)]
        self.groups = [g for g in self.groups if g not in done]
        return [FinishedGroup(g.request, [self._completion(i) for i in g.ids]) for g in done]

    def _completion(self, i: int) -> Completion:
        tokens, logprobs, truncated = self.batch.results[i]
        bounds = self.batch.weight_steps[i]  # (first token index, weight step), ascending
        steps = [next(s for start, s in reversed(bounds) if start <= t) for t in range(len(tokens))]
        return Completion.from_steps(tokens, logprobs, truncated, steps or [bounds[-1][1]])

    def _rebuild(self) -> None:
        """A new runner for the re-wrapped model (built at the next advance, at the engine's step); the
        unfinished groups' rows start over (regenerate)."""
        unfinished = [g.request for g in self.groups]
        log.info(
            "peft wrapped the engine's model: the stream's runner is rebuilt, %d groups start over", len(unfinished)
        )
        self.groups, self.batch = [], None
        self.queue.extendleft(reversed(unfinished))
