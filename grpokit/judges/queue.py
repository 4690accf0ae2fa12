"""A judge's own thread, so that judging runs while the engine generates (`judge.concurrent`).

The rollout loop scores a group as soon as its generation ends (grpokit.orchestrator.group_play); with a
judge, the group's conversations are handed to this queue and the loop goes back to the engine at once,
collecting the judged group later, in the order the groups finished (grpokit.judges.deferred). One
daemon thread asks the judge, one batch at a time, so the judge's backend (a BuiltinEngine, a classifier)
is never called from two threads.

- `merge` (runs with `data.deterministic: false`): the batches of every group waiting when the thread
  takes work are asked as one batch (up to `max_conversations`), so a judge on the builtin engine or a
  classifier scores several groups in one forward. A batch's make-up then depends on timing, and a
  model's float rounding on its batch, so a deterministic run does not merge:
- otherwise each group's batch is asked alone, in the order the groups finished: the very batches the
  synchronous path asks, so the scores are bit for bit the same, only earlier.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

Ask = Callable[[list[Any], list[str]], list[Any]]  # (conversations, labels) -> one result per conversation


class JudgeQueue:
    """Batches of conversations judged on one daemon thread of the judge's, in submission order."""

    def __init__(self, ask: Ask, merge: bool = False, max_conversations: int = 256, name: str = "judge") -> None:
        self.ask, self.merge, self.max_conversations = ask, merge, max_conversations
        self._cond = threading.Condition()
        self._waiting: collections.deque[tuple[list, list[str], Future]] = collections.deque()
        self._thread: threading.Thread | None = None
        self._name = f"grpokit-judge-{name}"

    def submit(self, conversations: list[Any], labels: list[str]) -> Future:
        """A Future of `ask(conversations, labels)`'s results; the ask's error, if it raises."""
        future: Future = Future()
        with self._cond:
            self._waiting.append((conversations, labels, future))
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return future

    def _take(self) -> list[tuple[list, list[str], Future]]:
        """The next batch's requests: the oldest, and with `merge` those after it that fit."""
        with self._cond:
            while not self._waiting:
                self._cond.wait()
            taken = [self._waiting.popleft()]
            size = len(taken[0][0])
            while self.merge and self._waiting and size + len(self._waiting[0][0]) <= self.max_conversations:
                taken.append(self._waiting.popleft())
                size += len(taken[-1][0])
            return taken

    def _work(self) -> None:
        while True:
            taken = self._take()
            conversations = [c for convs, _, _ in taken for c in convs]
            labels = [label for _, group_labels, _ in taken for label in group_labels]
            try:
                results = self.ask(conversations, labels)
            except BaseException as e:  # each waiting group sees the error (a RunDataError, a bug)
                for _, _, future in taken:
                    future.set_exception(e)
                continue
            start = 0
            for convs, _, future in taken:
                future.set_result(results[start : start + len(convs)])
                start += len(convs)
