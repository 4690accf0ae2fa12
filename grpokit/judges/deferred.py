"""Judging while the engine generates: a group's rollouts are made at once, their judge rewards later.

The rollout loop (grpokit.orchestrator.group_play) scores a finished group inside `deferring()`. There,
a judged environment (grpokit.judges.judged_env) sends the group's conversations to its judge's queue
(grpokit.judges.queue) and returns the rubric's scores without waiting; `deferring` collects one Deferred
per such batch. The loop makes the group's Rollouts from those scores, goes back to the engine, and hands
the group on once `ready`, in the order the groups finished, after `complete` has put the judge's part in:
each rollout's reward becomes the rubric's plus the weighted judge score, its metrics gain the judge's,
its notes the judge's reply. A failure policy that stops the run raises there, in the loop's thread.

Scoring outside `deferring()` (the eval loop of a verifiers Env episode, which scores on its own thread;
`judge.concurrent: false`) judges at once, as before.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass

from grpokit.types import Rollout

_local = threading.local()


@dataclass
class Deferred:
    """The judges' batches in flight (one future per judge) for `count` consecutive rollouts of a group:
    `finish([each judge's results])` gives their final (reward, metrics)."""

    futures: list[Future]
    finish: Callable[[list], list[tuple[float, dict]]]
    count: int


@contextlib.contextmanager
def deferring() -> Iterator[list[Deferred]]:
    """Within it, judged environments of this thread defer their judging; yields what they deferred."""
    previous = getattr(_local, "deferred", None)
    _local.deferred = collected = []
    try:
        yield collected
    finally:
        _local.deferred = previous


def deferred_here() -> list[Deferred] | None:
    """The list `deferring()` collects into on this thread, or None (judge now)."""
    return getattr(_local, "deferred", None)


def ready(deferred: list[Deferred]) -> bool:
    return all(f.done() for d in deferred for f in d.futures)


def complete(rollouts: list[Rollout], deferred: list[Deferred]) -> list[Rollout]:
    """The rollouts with their judges' parts in (each Deferred covers the next `count` of them); the
    judge's or the failure policy's error raises here."""
    start = 0
    for d in deferred:
        scores = d.finish([f.result() for f in d.futures])
        for rollout, (reward, metrics) in zip(rollouts[start : start + d.count], scores):
            rollout.reward = reward
            rollout.metrics = {**rollout.metrics, **{k: v for k, v in metrics.items() if not isinstance(v, str)}}
            rollout.notes = {**rollout.notes, **{k: v for k, v in metrics.items() if isinstance(v, str)}}
        start += d.count
    return rollouts
