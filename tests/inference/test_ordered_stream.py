"""RemoteEngine's deterministic stream (grpokit.inference.ordered.OrderedStream), against two stub
servers whose answers take the longer the earlier they were sent: each server gets its requests one
after another in submission order while the servers run in parallel, each request asks for the weights
held when it was submitted, and the groups come back one per advance in submission order although the
later ones were answered first."""

from __future__ import annotations

import threading
import time

import pytest

from grpokit.inference import SamplingSettings
from grpokit.inference.interrupting import InterruptingStream
from grpokit.inference.ordered import OrderedStream
from grpokit.inference.remote import RemoteEngine
from grpokit.inference.streams import ConcurrentStream, GroupRequest
from grpokit.types import WeightUpdate

pytestmark = pytest.mark.unit
URLS = ["http://a/v1", "http://b/v1"]


class StubServers(RemoteEngine):
    """RemoteEngine whose `_post` answers locally: request i sleeps longer the smaller i is, and the
    stub records when each server was busy and what it was asked."""

    def __init__(self) -> None:
        super().__init__(base_url=URLS, vocab_size=100, max_retries=0)
        self.log: list[tuple[str, int, float, float, int]] = []  # (url, prompt id, start, end, max_weight_step)
        self.busy: dict[str, int] = dict.fromkeys(URLS, 0)
        self.overlap = False
        self._lock = threading.Lock()

    def _post(self, url_body):
        url, body = url_body
        with self._lock:
            self.busy[url] += 1
            self.overlap |= self.busy[url] > 1
        start = time.monotonic()
        time.sleep(0.02 * (6 - body["prompt"][0]))
        with self._lock:
            self.busy[url] -= 1
            self.log.append((url, body["prompt"][0], start, time.monotonic(), body["max_weight_step"]))
        choice = {"token_ids": [body["prompt"][0]], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "stop"}
        return {"choices": [{**choice, "index": i} for i in range(body["n"])], "weight_step": body["max_weight_step"]}


def test_requests_go_in_submission_order_and_groups_come_back_in_it():
    engine = StubServers()
    engine.pin_weights = True  # data.deterministic
    stream = engine.open_stream(SamplingSettings(max_tokens=4, seed=1), max_rows=16, on_update="continue")
    assert isinstance(stream, OrderedStream)
    for g in range(3):
        stream.submit(GroupRequest(g, [g], 2))
    stream.load_weights(WeightUpdate(step=1, tensors={}))  # requests already submitted keep step 0
    for g in range(3, 6):
        stream.submit(GroupRequest(g, [g], 2))
    returned = []
    while stream.inflight:
        out = stream.advance()
        assert len(out) <= 1  # one group per advance
        returned += out
    stream.close()
    assert [f.request.key for f in returned] == list(range(6))
    assert [f.completions[0].policy_step for f in returned] == [0, 0, 0, 1, 1, 1]
    by_server = {url: [(p, s) for u, p, *_, s in engine.log if u == url] for url in URLS}
    assert by_server == {URLS[0]: [(0, 0), (2, 0), (4, 1)], URLS[1]: [(1, 0), (3, 1), (5, 1)]}
    assert not engine.overlap  # a server's requests one after another
    first_a, first_b = (next(e for e in engine.log if e[0] == url) for url in URLS)
    assert first_b[2] < first_a[3]  # the servers in parallel
    assert engine.log[0][1] != 0  # group 0 was answered after a later one, and still came back first


def test_a_step_is_asked_of_each_server_after_the_requests_sent_to_it_before(monkeypatch):
    """served_weight_step (the trainer's progress read from the servers) waits on each server's lane, so
    a server never loads a newer step before the older requests sent to it (which it would refuse)."""
    engine = StubServers()
    engine.pin_weights = True
    asked: dict[str, int] = {}  # server -> its requests answered when it was asked

    def weight_step_of(url, upto):
        asked[url] = sum(e[0] == url for e in engine.log)
        return upto

    monkeypatch.setattr(engine, "_weight_step_of", weight_step_of)
    stream = engine.open_stream(SamplingSettings(max_tokens=4), max_rows=16)
    for g in range(4):
        stream.submit(GroupRequest(g, [g], 1))
    assert engine.served_weight_step(upto=1) == 1
    assert asked == {URLS[0]: 2, URLS[1]: 2}
    stream.close()


@pytest.mark.parametrize(("on_update", "kind"), [("continue", InterruptingStream), ("finish", ConcurrentStream)])
def test_without_deterministic_the_stream_is_concurrent(on_update, kind):
    """data.deterministic: false keeps the concurrent streams (newest weights, updates cut requests)."""
    stream = StubServers().open_stream(SamplingSettings(max_tokens=4), max_rows=8, on_update=on_update)
    assert type(stream) is kind
    stream.close()
