"""Streaming generation: groups go into an engine while others are decoding, finished groups come back
as they finish, and new weights load between two decode steps.

The orchestrator's streaming rollout loop (grpokit.orchestrator.streaming) drives a GenerationStream from
one thread: `submit` a group (a prompt and its n completions), `advance` (at least one decode step;
returns the groups that finished), `load_weights` between two advances. An engine opens one with
`engine.open_stream(sampling, max_rows, on_update)`:

- BuiltinEngine's plain path: grpokit.inference.decode_stream.DecodeStream, a decode loop whose rows
  join (prefilled, their KV cache appended to the batch's) and leave between decode steps. A weight
  update re-prefills the unfinished rows with the new weights (`continue`: their tokens so far, so each
  later token's logits are the new weights' over the whole sequence; `regenerate`: from their prompts).
- Every other engine: BatchedStream below, which runs each advance's queued groups as one `generate`,
  so weights change only between whole batches (vLLM's server and `grpokit infer` serve one request
  at a time per call; what they allow mid-request is in docs/orchestrator.md, "Streaming rollouts").

A group's `seed` seeds the stream's sampler when it is admitted into an idle stream (no row decoding):
with one admission per step's prompts, as with max_async_level 0 and max_inflight covering a step,
the stream samples exactly what `generate` samples with that seed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # grpokit.inference opens streams: no import back at run time
    from grpokit.inference import Completion, SamplingSettings


@dataclass
class GroupRequest:
    """`n` completions of one prompt; `key` is the caller's handle, returned with them. `max_tokens`: this
    group's cap, in place of the stream's sampling.max_tokens (e.g. a conversation's remaining budget)."""

    key: Any
    prompt_ids: list[int]
    n: int
    seed: int | None = None
    max_tokens: int | None = None


@dataclass
class FinishedGroup:
    """A request's completions, in row order."""

    request: GroupRequest
    completions: list[Completion]


class GenerationStream(ABC):
    """Groups in flight in an engine (see the module docstring)."""

    def __init__(self, engine, sampling: SamplingSettings, max_rows: int) -> None:
        if max_rows < 1:
            raise ValueError(f"a generation stream needs max_rows >= 1, got {max_rows}")
        self.engine, self.sampling, self.max_rows = engine, sampling, max_rows
        self.queue: deque[GroupRequest] = deque()

    def submit(self, request: GroupRequest) -> None:
        """Queue a group; it starts decoding when rows are free."""
        self.queue.append(request)

    @property
    @abstractmethod
    def inflight(self) -> int:
        """Groups submitted and not yet returned (queued or decoding)."""

    @abstractmethod
    def advance(self) -> list[FinishedGroup]:
        """Admit queued groups where rows are free, decode, and return the groups that finished."""

    def load_weights(self, update) -> None:
        """Switch to `update`'s weights before the next decode step."""
        self.engine.load_weights(update)

    def close(self) -> None:
        """Drop whatever is in flight."""
        self.queue.clear()


class BatchedStream(GenerationStream):
    """A stream over any engine's `generate`: each advance generates every queued group (up to max_rows
    rows, at least one group) as one batch and returns them all, in submission order."""

    def __init__(self, engine, sampling: SamplingSettings, max_rows: int) -> None:
        super().__init__(engine, sampling, max_rows)

    @property
    def inflight(self) -> int:
        return len(self.queue)

    def advance(self) -> list[FinishedGroup]:
        taken: list[GroupRequest] = []
        while self.queue and (not taken or sum(r.n for r in taken) + self.queue[0].n <= self.max_rows):
            taken.append(self.queue.popleft())
        out: list[FinishedGroup] = []
        shapes = sorted({(r.n, r.max_tokens or self.sampling.max_tokens) for r in taken})
        for n, max_tokens in shapes:  # generate takes one n and one max_tokens: one call per shape
            same = [r for r in taken if (r.n, r.max_tokens or self.sampling.max_tokens) == (n, max_tokens)]
            seed = same[0].seed if same[0].seed is not None else self.sampling.seed
            sampling = replace(self.sampling, seed=seed, max_tokens=max_tokens)
            for request, completions in zip(same, self.engine.generate([r.prompt_ids for r in same], n, sampling)):
                out.append(FinishedGroup(request, completions))
        order = {id(r): i for i, r in enumerate(taken)}
        return sorted(out, key=lambda g: order[id(g.request)])
