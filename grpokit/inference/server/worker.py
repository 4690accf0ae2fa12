"""The server's engine thread: one daemon thread runs every tokenizer and engine call, in arrival order,
from a bounded queue (the engine is not thread-safe, nor are HF fast tokenizers).

- Bounded: a request that finds `max_queued` others waiting is refused at once (429) with a Retry-After
  estimated from the queue length and recent request times, instead of queueing without end.
- Cancellable: the HTTP layer withdraws the queued request of a client that hung up (it never reaches
  the engine), and sets the `cancelled` event of a running one (EngineCall): the engine stops it
  between two decode steps (ServingOptions.cancelled), so the next request starts within a step.
- Stoppable: `close` refuses new work, answers the queued requests 503, gives the running one
  `timeout` seconds, then cancels it and answers it 503 too. The thread is a daemon, so a process that
  exits does not wait for an engine that cannot be cancelled.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

from grpokit.inference.server.errors import RequestError

log = logging.getLogger(__name__)
MAX_RETRY_AFTER = 60  # seconds: a client should come back within a minute, whatever the estimate


class EngineCall:
    """What engine work knows of its request: `cancelled`, set once nobody waits for the answer (the
    client hung up, the server stops), and `emit`, where a streamed answer's server-sent events go (bytes,
    from the engine thread; None for a plain answer)."""

    __slots__ = ("cancelled", "emit")

    def __init__(self, emit: Callable[[bytes], None] | None = None) -> None:
        self.cancelled, self.emit = threading.Event(), emit


class OnEngine:
    """Work for the engine thread: the HTTP layer queues `work(call)` and answers with what it returns, as
    JSON; or, when `stream`, with the events the work emits (grpokit.inference.server.stream). `priority`:
    the request's place in the queue (vLLM's field: lower goes first)."""

    __slots__ = ("work", "stream", "priority")

    def __init__(self, work: Callable[[EngineCall], Any], stream: bool = False, priority: int = 0) -> None:
        self.work, self.stream, self.priority = work, stream, priority


class EngineWorker:
    """Runs submitted callables one at a time on a single daemon thread; see the module docstring."""

    def __init__(self, max_queued: int, name: str = "grpokit-engine") -> None:
        self.max_queued = max_queued
        self._queue: collections.deque[tuple[Future, Callable[[], Any], threading.Event | None, int]] = (
            collections.deque()
        )
        self._cond = threading.Condition()
        self._closed = False
        self._running: Future | None = None
        self._running_cancel: threading.Event | None = None
        self._running_since: float | None = None
        self.mean_seconds = 1.0  # moving average of request times, for Retry-After
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def health(self) -> dict:
        """GET /health's answer: `status()`, or a RequestError 503 once the thread has stopped."""
        status = self.status()
        if not status["alive"]:
            raise RequestError("the engine thread has stopped", status=503)
        return status

    def submit(self, work: Callable[[], Any], cancel: threading.Event | None = None, priority: int = 0) -> Future:
        """Queue `work`; a RequestError 429 when `max_queued` requests already wait, 503 once closed.
        `cancel`: the event that stops the work once it runs (close sets it after its timeout). The queue
        runs in order of `priority` (lower first, as vLLM's priority scheduling), then of arrival: a
        client continuing a request it aborted (grpokit.inference.interrupting) sends it with priority
        -1, so the continuation does not wait behind the requests sent after it."""
        with self._cond:
            if self._closed:
                raise RequestError("the server is shutting down", status=503, retry_after=self._retry_after())
            if len(self._queue) >= self.max_queued:
                raise RequestError(
                    f"{len(self._queue)} requests are waiting for the engine (server.limits.max_queued_requests="
                    f"{self.max_queued}); retry later",
                    status=429,
                    retry_after=self._retry_after(),
                )
            future: Future = Future()
            place = next((i for i, item in enumerate(self._queue) if item[3] > priority), len(self._queue))
            self._queue.insert(place, (future, work, cancel, priority))
            self._cond.notify()
        return future

    def withdraw(self, future: Future) -> bool:
        """Take a request whose client left out of the queue; False if the engine has already started it."""
        with self._cond:
            for item in self._queue:
                if item[0] is future:
                    self._queue.remove(item)
                    future.cancel()
                    return True
        return False

    def status(self) -> dict:
        """Queue length, and how long the running request has run (None when idle)."""
        with self._cond:
            since = self._running_since
            return {
                "queued": len(self._queue),
                "running_s": None if since is None else round(time.monotonic() - since, 3),
                "alive": self.thread.is_alive() and not self._closed,
            }

    def _retry_after(self) -> int:
        return max(1, min(MAX_RETRY_AFTER, math.ceil((len(self._queue) + 1) * self.mean_seconds)))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                future, work, cancel, _ = self._queue.popleft()
                if not future.set_running_or_notify_cancel():
                    continue
                self._running, self._running_since, self._running_cancel = future, time.monotonic(), cancel
            self._run(future, work)

    def _run(self, future: Future, work: Callable[[], Any]) -> None:
        start = time.monotonic()
        try:
            result, error = work(), None
        except BaseException as e:  # noqa: BLE001 - handed to the waiting request, which reports it
            result, error = None, e
        with self._cond:
            self._running = self._running_since = self._running_cancel = None
            self.mean_seconds = 0.8 * self.mean_seconds + 0.2 * (time.monotonic() - start)
        _settle(future, result, error)

    def close(self, timeout: float) -> bool:
        """Refuse new requests, answer the queued ones 503, wait up to `timeout` s for the running one (then
        answer it 503 too and cancel it: the engine thread ends after its current decode step). True when
        the engine thread has ended."""
        with self._cond:
            if self._closed:  # a second close (the server's, after SIGTERM's) does not wait again
                return not self.thread.is_alive()
            self._closed = True
            queued = [future for future, *_ in self._queue]
            self._queue.clear()
            self._cond.notify_all()
        stopping = RequestError("the server is shutting down", status=503, retry_after=1)
        for future in queued:
            _settle(future, None, stopping)
        self.thread.join(timeout)
        with self._cond:
            running, cancel = self._running, self._running_cancel
        if running is not None:
            log.warning("the engine is still running a request after %.1fs; cancelled, answering it 503", timeout)
            _settle(running, None, RequestError("the server stopped before this request finished", status=503))
        if cancel is not None:
            cancel.set()  # the engine stops it at its next decode step; nobody waits for that
        return not self.thread.is_alive()


def _settle(future: Future, result: Any, error: BaseException | None) -> None:
    """Complete `future` unless close() or a cancel has already done so."""
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except InvalidStateError:
        pass
