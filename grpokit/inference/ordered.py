"""A stream over servers that reproduces bit for bit: RemoteEngine's stream with `data.deterministic`.

What a server computes depends on more than a request: `grpokit infer` answers one request at a time
with the newest weights up to its `max_weight_step`, and its prefix cache carries state from one request
to the next. A stream of concurrent requests (grpokit.inference.streams.ConcurrentStream) leaves to
timing the order requests reach a server, which weights they meet (the newest the server has loaded),
where an update cuts them (grpokit.inference.interrupting) and which groups come back first, and so
which groups form a step's batch. OrderedStream fixes each of these by the order of submission:

- a group's request is built when it is submitted, from the weights the engine holds then (its
  `max_weight_step`, or VLLMEngine's adapter) and the submission's seed, and sent at once on its
  server's lane (RemoteEngine.send_in_order: round-robin over the servers, each server's requests one
  after another in submission order, the servers in parallel); the rollout driver loads an update
  when the first group that needs it is submitted (grpokit.orchestrator.weights), so the steps a
  server is asked for never go down;
- an update never cuts a request: it finishes on the weights it was sent with and the update applies
  to the requests submitted after it (`on_update: finish`, whatever the recipe asks);
- `advance` returns the oldest group in flight once it is answered, one group per advance, never a
  newer one first, so the driver sees the groups finish in submission order and a step's batch is a
  function of the schedule.

The cost: one request at a time per server (grpokit's server runs them in turn anyway; a vLLM server
loses its continuous batching across groups), and a slow group holds back the groups behind it.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from grpokit.inference.streams import FinishedGroup, GenerationStream, GroupRequest

if TYPE_CHECKING:
    from grpokit.inference import SamplingSettings


@dataclass
class _Sent:
    """A group's request on its server's lane."""

    request: GroupRequest
    url: str
    sampling: SamplingSettings
    answer: cf.Future


class OrderedStream(GenerationStream):
    """RemoteEngine's deterministic stream (see the module docstring). A group's seed is its request's
    (or the stream's) times 1,000,003 plus its submission number, as in ConcurrentStream. `wait`: the
    longest an advance waits for the oldest group's answer before it returns none."""

    def __init__(self, engine, sampling: SamplingSettings, max_rows: int, wait: float = 0.05) -> None:
        super().__init__(engine, sampling, max_rows)
        self.sent: deque[_Sent] = deque()
        self.submitted, self.wait = 0, wait
        self.takes_images = bool(getattr(engine, "takes_vision", False))

    @property
    def inflight(self) -> int:
        return len(self.sent)

    def submit(self, request: GroupRequest) -> None:
        """Build the group's request with the weights the engine holds now and send it on its server's lane."""
        base = request.seed if request.seed is not None else self.sampling.seed or 0
        max_tokens = request.max_tokens or self.sampling.max_tokens
        sampling = replace(self.sampling, seed=base * 1_000_003 + self.submitted, max_tokens=max_tokens)
        self.submitted += 1
        engine = self.engine
        url = engine.next_url()
        body = engine._body(request.prompt_ids, request.n, sampling, 0, request.vision)
        body["max_weight_step"] = max(engine.weight_step, 0)  # grpokit's server (dropped for others)
        self.sent.append(_Sent(request, url, sampling, engine.send_in_order(url, body)))

    def advance(self) -> list[FinishedGroup]:
        """The oldest group in flight once it is answered (waiting up to `wait` seconds), else none."""
        if not self.sent:
            return []
        oldest = self.sent[0]
        try:
            answer = oldest.answer.result(timeout=self.wait)
        except cf.TimeoutError:
            return []
        self.sent.popleft()
        completions = self.engine._group(oldest.url, answer, oldest.request.n, oldest.sampling)
        return [FinishedGroup(oldest.request, completions)]

    def close(self, wait: float = 60.0) -> None:
        """Drop the requests not yet sent and wait up to `wait` seconds for those being answered (a server
        stopped under them would hang its shutdown on them), as ConcurrentStream does. (VLLMEngine: the
        adapter a dropped request was made with stays loaded until the server stops; the run is ending.)"""
        super().close()
        for sent in self.sent:
            sent.answer.cancel()
        cf.wait([s.answer for s in self.sent], timeout=wait)
        self.sent.clear()
