"""The inference server going away mid-request: RemoteEngine retries with exponential backoff, then reports.

The peer is a real loopback HTTP server that drops connections or cuts answers short
(tests.support.ScriptedServer); a real `grpokit infer` process killed mid-run and restarted is
tests/faults/test_kills.py.
"""

import time

import pytest

from grpokit.inference import SamplingSettings
from grpokit.inference.remote import RemoteEngine
from tests.support import ScriptedServer

ANSWER = {
    "choices": [
        {"index": 0, "token_ids": [5, 6], "logprobs": {"token_logprobs": [-0.25, -0.5]}, "finish_reason": "stop"}
    ],
    "weight_step": 3,
}


def engine(url: str, **settings) -> RemoteEngine:
    remote = RemoteEngine(base_url=url, **settings)
    remote.setup("unused")
    return remote


def test_dropped_and_truncated_answers_are_retried_with_backoff(caplog):
    with ScriptedServer(["close", "half", ANSWER]) as server:
        [[completion]] = engine(server.url, max_retries=3).generate([[1, 2]], 1, SamplingSettings(max_tokens=4))
    assert (completion.token_ids, completion.logprobs, completion.policy_step) == ([5, 6], [-0.25, -0.5], 3)
    t = server.request_times
    assert len(t) == 3 and t[1] - t[0] >= 0.5 and t[2] - t[1] >= 1.0  # backoff 0.5 s, then 1 s
    assert "; try 1 of 4), retrying in 0.5s" in caplog.text and "; try 2 of 4), retrying in 1.0s" in caplog.text
    assert "failed (RemoteDisconnected: " in caplog.text, caplog.text  # the cause of each retry


def test_a_server_that_stays_away_is_reported_naming_it_and_the_settings():
    with ScriptedServer(["close"]) as server:
        start = time.monotonic()
        with pytest.raises(
            ConnectionError,
            match=rf"inference server {server.url} failed 3 tries .*inference.init_args.max_retries \(2\)",
        ):
            engine(server.url, max_retries=2).generate([[1, 2]], 1, SamplingSettings(max_tokens=4))
    assert len(server.request_times) == 3 and time.monotonic() - start >= 1.5


def test_nothing_listening_is_reported_after_the_retries():
    with ScriptedServer([ANSWER]) as server:
        url = server.url  # a port that was just freed: connections are refused
    with pytest.raises(ConnectionError, match="failed 2 tries .*Connection refused"):
        engine(url, max_retries=1).generate([[1]], 1, SamplingSettings(max_tokens=4))
