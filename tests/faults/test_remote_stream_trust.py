"""A server's streamed answers (RemoteEngine's stream, grpokit.inference.interrupting) are checked as its
plain answers are: a chunk that is not JSON, an error event, a choice past the request's, token ids
without their logprobs or outside the vocabulary each fail with an error naming the server; an answer
cut short (no `[DONE]`, a choice unfinished) is continued from its tokens so far, at most max_retries
times in a row. The peer is a real loopback HTTP server (tests.support.ScriptedServer) answering raw
server-sent events."""

from __future__ import annotations

import json

import pytest

from grpokit.inference import SamplingSettings
from grpokit.inference.remote import RemoteEngine
from grpokit.inference.streams import GroupRequest
from tests.support import ScriptedServer, drain

pytestmark = pytest.mark.unit


def chunk(index: int, ids: list, logprobs: list, finish: str | None = None) -> dict:
    choice = {"index": index, "token_ids": ids, "logprobs": {"token_logprobs": logprobs}, "finish_reason": finish}
    return {"choices": [choice], "weight_step": 3}


def events(*chunks: dict, done: bool = True) -> bytes:
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def stream_group(server: ScriptedServer, n: int = 1, max_tokens: int = 4, retries: int = 0) -> list:
    remote = RemoteEngine(base_url=server.url, max_retries=retries, vocab_size=100)
    remote.setup("unused")
    stream = remote.open_stream(SamplingSettings(max_tokens=max_tokens), 8)
    stream.submit(GroupRequest("g", [1, 2], n))
    try:
        return drain(stream)["g"]
    finally:
        stream.close()


@pytest.mark.parametrize(
    ("body", "fault"),
    [
        (b"data: not json\n\n", r"streamed a chunk that is not JSON: b'not json'"),
        (events({"error": {"message": "engine died"}}), r"streamed an error: .*engine died"),
        (events(chunk(3, [5], [-0.1], "stop")), r"streamed choice 3 of a 1-choice request"),
        (events(chunk(0, [5, 6], [-0.1], "stop")), r"streamed \[5, 6\] token ids with logprobs \[-0.1\]"),
        (events(chunk(0, [5, 150], [-0.1, -0.2], "stop")), r"token ids \[150\] are outside the vocabulary"),
        (events(chunk(0, [5], [0.7], "stop")), r"logprobs \[0.7\] are above 0"),
    ],
    ids=["not-json", "error-event", "choice-index", "no-logprobs", "vocabulary", "logprob"],
)
def test_a_malformed_streamed_answer_is_refused_naming_the_server(body, fault):
    with ScriptedServer([body]) as server:
        with pytest.raises(ValueError, match=fault) as raised:
            stream_group(server)
        assert server.url in str(raised.value)


def test_an_answer_cut_short_is_continued_from_its_tokens_so_far():
    cut = events(chunk(0, [5], [-0.1]), chunk(1, [8], [-0.4]), done=False)
    rest = events(chunk(0, [6, 7], [-0.2, -0.3], "stop"), chunk(1, [9], [-0.5], "length"))
    with ScriptedServer([cut, rest]) as server:
        first, second = stream_group(server, n=2, max_tokens=3, retries=1)
    assert (first.token_ids, first.logprobs, first.is_truncated) == ([5, 6, 7], [-0.1, -0.2, -0.3], False)
    assert (second.token_ids, second.is_truncated, second.policy_step) == ([8, 9], True, 3)
    body = server.request_bodies[1]
    assert body["prompt"] == [[1, 2, 5], [1, 2, 8]] and body["n"] == 1 and body["max_tokens"] == 2
    assert body["stream"] is True and "seed" not in body and "seed" in server.request_bodies[0]
    assert body["priority"] == -1 and "priority" not in server.request_bodies[0]  # ahead of later requests


def test_answers_cut_short_more_than_max_retries_times_in_a_row_fail():
    cut = events(chunk(0, [5], [-0.1]), done=False)
    with ScriptedServer([cut]) as server:
        with pytest.raises(ConnectionError, match=r"cut its streamed answer 2 times in a row .*max_retries 1"):
            stream_group(server, max_tokens=8, retries=1)
    assert len(server.request_times) == 2
