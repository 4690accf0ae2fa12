"""In-flight weight updates on servers (RemoteEngine, VLLMEngine): abort the requests in flight and
resubmit their continuations with the new weights, AReaL's interruptible generation.

An OpenAI server loads new weights between requests only: vLLM keeps a request on the LoRA adapter it
was sent with, grpokit's server loads a step before a request (bench/vllm_inflight.py measured vLLM's).
So a rollout spans an update this way: every group is a streamed request (`stream: true`, token ids and
logprobs in each chunk) whose tokens are kept as they arrive; when the stream loads new weights, each
request in flight closes its connection at its next chunk (the server aborts it), and its unfinished
completions are sent again as a continuation: prompt + their tokens so far as the prompt, the rest of
the token budget (`max_tokens`, `min_tokens` less the tokens so far), under the new weights. Each
token records the weight step of the answer it came in (grpokit's `weight_step`; vLLM's echoed adapter
name), so `Completion.token_steps` is exact, and its logprob is the one the server computed with those
weights over the whole sequence so far, as the builtin engine's `continue` re-prefill computes it.
`regenerate` resubmits the unfinished completions from their prompt instead.

What a continuation costs is one prefill of its sequence so far (vLLM's CPU build: about 4 token gaps
for a 32-token prefix, docs/orchestrator.md). A group's completions decode in lock step, so they are
continued as one request of several prompts: those that had received a token more than the shortest
give it up (it is sampled again, with the new weights; which ones does not depend on the tokens, only
on when their chunks arrived, so the draw stays one of the mixed-weight process). Continuations are not
seeded: a prompt list under one seed would draw the same random numbers for every prompt on vLLM, and
a streamed run is not bit-reproducible anyway. They carry vLLM's `priority` field
(RemoteEngine.continuation_priority, -1): grpokit's server runs requests in turn, and would otherwise
queue the oldest group behind the ones sent after it (VLLMEngine sends none: vLLM refuses the field
unless started with --scheduling-policy priority, and its continuous batching does not queue so).
A stop string that would begin in one segment and end in the next is not seen by the server (it
matches the new text only). A connection lost mid-answer is continued the same way, at most
max_retries times in a row. A server that sends a completion whole when it ends (grpokit's server on
the fast CUDA path) cannot be interrupted: its completions finish on the weights they began with, and
say so.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING

from grpokit.inference.finish import server_finish_reason
from grpokit.inference.streams import ConcurrentStream, GroupRequest

if TYPE_CHECKING:
    from grpokit.inference import Completion, SamplingSettings

log = logging.getLogger(__name__)


@dataclass
class SegmentChoice:
    """One choice's tokens in one streamed answer."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class Segment:
    """What a streamed request answered before it ended or was closed: per choice index its tokens,
    the weight step (grpokit's `weight_step`) or served model name (vLLM's adapter) of its chunks, and
    whether it was cut (closed, or the connection lost, before every choice had finished)."""

    choices: dict[int, SegmentChoice] = field(default_factory=dict)
    weight_step: int | None = None
    model: str | None = None
    cut: bool = False
    chunks: int = 0

    def add(self, event: dict, url: str) -> None:
        """One chunk's choices (a usage chunk has none)."""
        if self.chunks == 0:
            self.model = event.get("model") if isinstance(event.get("model"), str) else None
            step = event.get("weight_step")
            self.weight_step = step if isinstance(step, int) and not isinstance(step, bool) else None
        self.chunks += 1
        choices = event.get("choices")
        if not isinstance(choices, list):
            raise ValueError(f"inference server {url} streamed a chunk without a 'choices' list: {str(event)[:200]}")
        for choice in choices:
            index = choice.get("index") if isinstance(choice, dict) else None
            if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                raise ValueError(f"inference server {url} streamed a choice without an integer index: {choice!r}")
            ids = choice.get("token_ids") or []
            logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
            if not isinstance(ids, list) or not isinstance(logprobs, list) or len(ids) != len(logprobs):
                raise ValueError(
                    f"inference server {url} streamed {ids!r} token ids with logprobs {logprobs!r}: a streamed "
                    "chunk needs as many of each (the server must support logprobs and return_token_ids)"
                )
            into = self.choices.setdefault(index, SegmentChoice())
            into.token_ids += ids
            into.logprobs += logprobs
            if choice.get("finish_reason") is not None:
                into.finish_reason = choice["finish_reason"]

    def finished(self, n: int) -> bool:
        return len(self.choices) >= n and all(c.finish_reason is not None for c in self.choices.values())


def read_segment(response, interrupted, url: str, n: int | None = None) -> Segment:
    """Read a streamed completions answer (server-sent `data:` events, `[DONE]` last) into a Segment,
    stopping after any chunk at which `interrupted(segment)` is true. A connection lost before the first
    chunk is raised (RemoteEngine retries the request); after it, the segment is returned cut."""
    segment = Segment()
    try:
        for line in response:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return segment
            try:
                event = json.loads(data)
            except json.JSONDecodeError:
                raise ValueError(f"inference server {url} streamed a chunk that is not JSON: {data[:200]!r}") from None
            if not isinstance(event, dict):
                raise ValueError(f"inference server {url} streamed a chunk that is not an object: {data[:200]!r}")
            if "error" in event and not event.get("choices"):
                raise ValueError(f"inference server {url} streamed an error: {str(event['error'])[:500]}")
            segment.add(event, url)
            if interrupted(segment) and not segment.finished(n or len(segment.choices)):
                segment.cut = True
                return segment
    except (ConnectionError, TimeoutError, http.client.HTTPException) as e:
        if segment.chunks == 0:
            raise
        log.warning("inference server %s lost a streamed answer after %d chunks (%s)", url, segment.chunks, e)
    segment.cut = True  # the answer ended without [DONE]
    return segment


@dataclass
class _Row:
    """One completion of a group, across the requests that produced it."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    def extend(self, choice: SegmentChoice, step: int) -> None:
        self.token_ids += choice.token_ids
        self.logprobs += choice.logprobs
        self.steps += [step] * len(choice.token_ids)
        self.finish_reason = choice.finish_reason

    def keep(self, length: int) -> None:
        del self.token_ids[length:], self.logprobs[length:], self.steps[length:]


class InterruptingStream(ConcurrentStream):
    """ConcurrentStream whose weight updates reach the requests in flight (see the module docstring):
    `continue` resubmits their tokens so far as a continuation under the new weights, `regenerate`
    their prompts. `interruptions` counts the requests closed by an update, `chunks` the streamed chunks
    read (progress a caller may watch)."""

    def __init__(self, engine, sampling: SamplingSettings, max_rows: int, max_requests: int, on_update: str):
        if on_update not in ("continue", "regenerate"):
            raise ValueError(f"on_update must be 'continue' or 'regenerate', got {on_update!r}")
        super().__init__(engine, sampling, max_rows, max_requests)
        self.on_update = on_update
        self.epoch = 0  # weight updates loaded; a request sent at another epoch is closed at its next chunk
        self.closing = False
        self.interruptions = self.chunks = 0
        self._lock = threading.Lock()

    def load_weights(self, update) -> None:
        self.engine.load_weights(update)
        with self._lock:
            self.epoch += 1

    def close(self, wait: float = 60.0) -> None:
        """Close the requests in flight at their next chunk, then wait for their threads (up to `wait`)."""
        self.closing = True
        super().close(wait)

    def _work(self, request: GroupRequest, sampling: SamplingSettings) -> list[Completion]:
        url = self.engine.next_url()
        rows = [_Row() for _ in range(request.n)]
        first, lost = True, 0
        while live := self._unfinished(rows, sampling):
            if self.closing:
                raise RuntimeError("the generation stream was closed")
            epoch = self.epoch
            body = self._body(request, sampling, live, first)
            segment = self.engine.stream_completion(url, body, partial(self._outdated, epoch))
            first = False
            self._take(segment, live, url)
            if segment.cut and self.epoch != epoch:
                with self._lock:
                    self.interruptions += 1
                lost = 0
                if self.on_update == "regenerate":
                    for row in self._unfinished(live, sampling):
                        row.keep(0)
            elif segment.cut and not self.closing:
                lost += 1
                if lost > self.engine.max_retries:
                    raise ConnectionError(
                        f"inference server {url} cut its streamed answer {lost} times in a row "
                        f"(inference.init_args.max_retries {self.engine.max_retries})"
                    )
        try:
            return [self._completion(row, sampling) for row in rows]
        except ValueError as e:
            raise ValueError(f"inference server {url}: {e}") from None

    def _outdated(self, epoch: int, segment: Segment) -> bool:
        """After each chunk of a request sent at `epoch`: whether to close it. Yes when the stream closes,
        or when weights newer than the answer's have loaded since (a request a server queued until after
        the update, and so answers with the new weights, runs on)."""
        self.chunks += 1
        if self.closing:
            return True
        if self.epoch == epoch:
            return False
        step = self.engine.segment_step(segment)
        return step is None or step < self.engine.weight_step

    @staticmethod
    def _unfinished(rows: list[_Row], sampling: SamplingSettings) -> list[_Row]:
        """The rows still to decode; one whose last token came without its finish chunk ends at max_tokens."""
        for row in rows:
            if row.finish_reason is None and len(row.token_ids) >= sampling.max_tokens:
                row.finish_reason = "length"
        return [r for r in rows if r.finish_reason is None]

    @staticmethod
    def _take(segment: Segment, live: list[_Row], url: str) -> None:
        """A segment's tokens onto the rows its choices answer (choice i: live[i]). A choice the server
        aborted (vLLM's finish_reason "abort" or "error") is unfinished, not stopped: the segment counts as
        cut and the row is continued like one a lost connection cut (at most max_retries times in a row)."""
        for index, choice in segment.choices.items():
            if index >= len(live):
                raise ValueError(f"inference server {url} streamed choice {index} of a {len(live)}-choice request")
            live[index].extend(choice, segment.weight_step)
            if choice.finish_reason is not None and server_finish_reason(choice.finish_reason) == "abort":
                live[index].finish_reason, segment.cut = None, True
        if not segment.cut and (unfinished := [i for i, r in enumerate(live) if r.finish_reason is None]):
            raise ValueError(f"inference server {url} ended its answer with choices {unfinished} unfinished")

    def _body(self, request: GroupRequest, sampling: SamplingSettings, live: list[_Row], first: bool) -> dict:
        """The next request for a group's unfinished rows: its prompt (n = the rows) when none has a token,
        else their continuations, each cut to the shortest row's length (one prompt each, n = 1)."""
        engine = self.engine
        done = min(len(r.token_ids) for r in live)
        for row in live:
            row.keep(done)
        if done == 0:
            body = engine._body(request.prompt_ids, len(live), sampling, 0, request.vision)
        else:
            rest = replace(
                sampling, max_tokens=sampling.max_tokens - done, min_tokens=max(0, sampling.min_tokens - done)
            )
            continued = [request.prompt_ids + row.token_ids for row in live]  # one `vision` serves them all
            body = engine._body(continued, 1, rest, 0, request.vision)
        if not first:  # a continuation (or a restart): unseeded, and ahead of the requests sent since
            body.pop("seed", None)
            if engine.continuation_priority is not None:
                body["priority"] = engine.continuation_priority
        return body

    def _completion(self, row: _Row, sampling: SamplingSettings) -> Completion:
        """The row as a Completion, checked as RemoteEngine checks an answer, its tokens' steps kept."""
        from grpokit.inference import Completion

        choice = {
            "index": 0,
            "token_ids": row.token_ids,
            "logprobs": {"token_logprobs": row.logprobs},
            "finish_reason": row.finish_reason,
        }
        checked = self.engine._completion(choice, {"weight_step": row.steps[0] if row.steps else None}, sampling)
        if not row.steps:
            return checked
        return Completion.from_steps(
            checked.token_ids, checked.logprobs, checked.is_truncated, row.steps, checked.finish_reason
        )
