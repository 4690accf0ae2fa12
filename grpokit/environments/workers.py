"""The threads that run environment code with a timeout: tool calls and a task's `respond`.

Python cannot stop a thread, so a call that never returns keeps its thread for good. Two rules keep such
a call from harming the run:

- The workers are daemon threads. A ThreadPoolExecutor's workers are joined when the interpreter exits,
  so one hung tool kept the process alive after the run's last step; a daemon is not waited for.
- A call given up on (`abandon`, when its timeout passes) frees its place in the pool: the pool holds at
  most `size` workers on calls not given up on, and starts a new one when work waits. Eight hung calls
  used to fill the pool of 8, and every later call, healthy or not, timed out for the rest of the run.

`stuck` counts the threads still running calls given up on (reported with each timeout's warning).
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any


class ToolPool:
    """Daemon worker threads running calls; at most `size` of them on calls not given up on."""

    def __init__(self, size: int, name: str) -> None:
        self.size, self.name = size, name
        self._cond = threading.Condition()
        self._pending: collections.deque = collections.deque()
        self._idle = 0  # workers waiting for a call
        self._healthy = 0  # workers alive whose call (if any) is not given up on
        self._owners: dict[concurrent.futures.Future, threading.Thread] = {}
        self._abandoned: set[threading.Thread] = set()
        self._started = 0

    @property
    def stuck(self) -> int:
        """Threads still running a call that was given up on."""
        with self._cond:
            return len(self._abandoned)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        """Queue `fn(*args, **kwargs)`; a new worker starts when no idle one will take it and fewer than
        `size` are healthy."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            self._pending.append((future, fn, args, kwargs))
            self._cond.notify()
            self._grow()
        return future

    def abandon(self, future: concurrent.futures.Future) -> None:
        """Give up on `future`: cancel it while still queued, else free its worker's place (the worker
        ends once the call returns, if ever) and start another if calls are waiting."""
        with self._cond:
            worker = self._owners.pop(future, None)
            if worker is None:
                future.cancel()
                return
            self._abandoned.add(worker)
            self._healthy -= 1
            self._grow()

    def _grow(self) -> None:
        """Start a worker when queued calls outnumber the idle workers (the condition's lock held)."""
        if len(self._pending) > self._idle and self._healthy < self.size:
            self._healthy += 1
            self._started += 1
            name = f"{self.name}-{self._started}"
            threading.Thread(target=self._work, name=name, daemon=True).start()

    def _work(self) -> None:
        """A worker: take queued calls and run them, until a call of its was given up on (then end)."""
        me = threading.current_thread()
        while True:
            with self._cond:
                self._idle += 1
                while not self._pending:
                    self._cond.wait()
                self._idle -= 1
                future, fn, args, kwargs = self._pending.popleft()
                if not future.set_running_or_notify_cancel():
                    continue
                self._owners[future] = me
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:  # the caller sees the call's error, whatever it is
                future.set_exception(e)
            else:
                future.set_result(result)
            with self._cond:
                self._owners.pop(future, None)
                if me in self._abandoned:  # its place went to another worker: end
                    self._abandoned.discard(me)
                    return


POOL = ToolPool(8, "grpokit-tool")
