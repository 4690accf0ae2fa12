"""The server's engine queue runs requests by priority (vLLM's `priority` field: lower first), then in
arrival order; the field is checked like every other."""

from __future__ import annotations

import threading

import pytest

from grpokit.inference.server.limits import ServerLimits
from grpokit.inference.server.requests import RequestError, SamplingRequest
from grpokit.inference.server.worker import EngineWorker

pytestmark = pytest.mark.unit


def test_the_queue_runs_by_priority_then_by_arrival():
    worker, ran, gate = EngineWorker(max_queued=8), [], threading.Event()
    blocker = worker.submit(gate.wait)  # holds the engine thread while the others queue
    futures = [
        worker.submit(lambda name=name: ran.append(name), priority=priority)
        for name, priority in [("a", 0), ("b", 0), ("continued", -1), ("c", 0), ("late", 5), ("urgent", -1)]
    ]
    gate.set()
    for future in [blocker, *futures]:
        future.result(timeout=10)
    assert ran == ["continued", "urgent", "a", "b", "c", "late"]
    worker.close(timeout=1)


def test_priority_is_checked_and_defaults_to_zero():
    limits = ServerLimits()
    assert SamplingRequest.parse({}, 4, True, limits).priority == 0
    assert SamplingRequest.parse({"priority": -1}, 4, True, limits).priority == -1
    for bad in ("high", 1.5, 2**40):
        with pytest.raises(RequestError, match="priority") as raised:
            SamplingRequest.parse({"priority": bad}, 4, True, limits)
        assert raised.value.status == 400
