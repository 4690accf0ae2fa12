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
- RemoteEngine (`grpokit infer`) and VLLMEngine: ConcurrentStream below, one request per group in
  flight at once, each group back as its request is answered. A weight update aborts the requests in
  flight and resubmits their continuations with the new weights (grpokit.inference.interrupting), or,
  with `on_update: finish`, applies to the requests sent after it. With data.deterministic
  (RemoteEngine.pin_weights) they open grpokit.inference.ordered.OrderedStream instead: each server's
  requests in submission order, never cut, the groups back in that order.
- Every other engine: BatchedStream below, which runs each advance's queued groups as one `generate`,
  so weights change only between whole batches.

A group's `seed` seeds the stream's sampler when it is admitted into an idle stream (no row decoding):
with one admission per step's prompts, as with max_async_level 0 and max_inflight covering a step,
the stream samples exactly what `generate` samples with that seed.

A group whose prompt holds images (`vision`) is taken only by a stream with `takes_images`: BuiltinEngine's
plain path, which samples it on its own (grpokit.inference.image_rows), and the streams below over an
engine whose `generate` takes `vision=` (`takes_vision`: RemoteEngine, which sends the group's image
inputs with its token ids to `grpokit infer`).
"""

from __future__ import annotations

import concurrent.futures as cf
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # grpokit.inference opens streams: no import back at run time
    from grpokit.inference import Completion, SamplingSettings


@dataclass
class GroupRequest:
    """`n` completions of one prompt; `key` is the caller's handle, returned with them. `max_tokens`: this
    group's cap, in place of the stream's sampling.max_tokens (e.g. a conversation's remaining budget).
    `vision`: the prompt's image inputs (grpokit.vision.inputs.VisionInputs), None for a text prompt."""

    key: Any
    prompt_ids: list[int]
    n: int
    seed: int | None = None
    max_tokens: int | None = None
    vision: Any = None


@dataclass
class FinishedGroup:
    """A request's completions, in row order."""

    request: GroupRequest
    completions: list[Completion]


def vision_kwargs(requests: list[GroupRequest]) -> dict:
    """`generate`'s `vision=` for these groups' prompts when any holds images (engines with `takes_vision`)."""
    return {"vision": [r.vision for r in requests]} if any(r.vision for r in requests) else {}


class GenerationStream(ABC):
    """Groups in flight in an engine (see the module docstring)."""

    max_len: int | None = None  # tokens a row holds, prompt + completion (a fixed KV cache); None: the context
    takes_images = False  # samples groups whose prompt holds images (GroupRequest.vision)

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
        self.takes_images = bool(getattr(engine, "takes_vision", False))

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
            groups = self.engine.generate([r.prompt_ids for r in same], n, sampling, **vision_kwargs(same))
            for request, completions in zip(same, groups):
                out.append(FinishedGroup(request, completions))
        order = {id(r): i for i, r in enumerate(taken)}
        return sorted(out, key=lambda g: order[id(g.request)])


class ConcurrentStream(GenerationStream):
    """A stream over servers (RemoteEngine): each group is its own `generate` call, up to `max_requests`
    in flight on worker threads (RemoteEngine's max_concurrency), and an advance returns the groups
    whose answers have come, waiting up to `wait` seconds for one. A group's seed is its request's seed
    (or the stream's) times 1,000,003 plus its submission number, so groups of one block sample apart.
    Weights load between requests: the server answers each with the step it sampled with."""

    def __init__(self, engine, sampling: SamplingSettings, max_rows: int, max_requests: int, wait: float = 0.05):
        super().__init__(engine, sampling, max_rows)
        self.takes_images = bool(getattr(engine, "takes_vision", False))
        self.pool = cf.ThreadPoolExecutor(max_workers=max(1, max_requests), thread_name_prefix="grpokit-stream")
        self.running: dict[cf.Future, tuple[int, GroupRequest]] = {}
        self.submitted, self.wait = 0, wait

    @property
    def inflight(self) -> int:
        return len(self.queue) + len(self.running)

    def advance(self) -> list[FinishedGroup]:
        while self.queue:
            request = self.queue.popleft()
            base = request.seed if request.seed is not None else self.sampling.seed or 0
            max_tokens = request.max_tokens or self.sampling.max_tokens
            sampling = replace(self.sampling, seed=base * 1_000_003 + self.submitted, max_tokens=max_tokens)
            future = self.pool.submit(self._work, request, sampling)
            self.running[future] = (self.submitted, request)
            self.submitted += 1
        if not self.running:
            return []
        done, _ = cf.wait(self.running, timeout=self.wait, return_when=cf.FIRST_COMPLETED)
        finished = sorted((self.running.pop(f), f) for f in done)  # in submission order
        return [FinishedGroup(request, future.result()) for (_, request), future in finished]

    def _work(self, request: GroupRequest, sampling: SamplingSettings) -> list[Completion]:
        """A group's completions (on a worker thread)."""
        return self.engine.generate([request.prompt_ids], request.n, sampling, **vision_kwargs([request]))[0]

    def close(self, wait: float = 60.0) -> None:
        """Drop the queued groups and wait up to `wait` seconds for the requests in flight (as a whole-batch
        run's last generate is waited for): a server stopped under them (`grpokit fit` stops its vLLM
        next) would hang its shutdown on them, and their retries would outlive the run."""
        super().close()
        cf.wait(list(self.running), timeout=wait)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.running.clear()
