"""RemoteEngine trusts nothing a server says: redirects are refused (the API key never leaves for another
address), answers are checked before they become rollouts (n choices, token ids in the vocabulary, at
most max_tokens of them, logprobs <= 0) with an error naming the server and the fault, and busy servers
(429, 503) are retried no sooner than their Retry-After. The peer is a real loopback HTTP server
(tests.support.ScriptedServer)."""

from __future__ import annotations

import email.utils
import time

import pytest

from grpokit.inference import SamplingSettings
from grpokit.inference.remote import RemoteEngine, RemoteError, retry_after
from tests.support import ScriptedServer


def choice(index: int, token_ids: list, logprobs: list) -> dict:
    return {"index": index, "token_ids": token_ids, "logprobs": {"token_logprobs": logprobs}, "finish_reason": "stop"}


def answer(*choices: dict) -> dict:
    return {"choices": list(choices), "weight_step": 0}


def engine(url: str, model: str = "unused", **settings) -> RemoteEngine:
    remote = RemoteEngine(base_url=url, **settings)
    remote.setup(model)
    return remote


def test_a_redirect_is_refused_and_the_key_never_reaches_the_other_host(monkeypatch):
    monkeypatch.setenv("GRPOKIT_TEST_KEY", "sk-secret")
    with ScriptedServer([answer(choice(0, [5], [-0.5]))]) as elsewhere:
        redirect = (307, {"Location": elsewhere.url + "/completions"}, {})
        with ScriptedServer([redirect]) as server:
            remote = engine(server.url, api_key_var="GRPOKIT_TEST_KEY", max_retries=3, vocab_size=100)
            with pytest.raises(RemoteError, match=r"answered 307, a redirect to .*follows no redirects.*base_url"):
                remote.generate([[1]], 1, SamplingSettings(max_tokens=2))
        assert len(server.request_times) == 1  # not retried
        assert elsewhere.request_times == []  # never contacted, so never saw the key


@pytest.mark.parametrize(
    ("reply", "n", "fault"),
    [
        (
            answer(choice(0, [5], [-0.1]), choice(1, [6], [-0.2])),
            8,
            r"answered 2 choices with indices \[0, 1\] for n=8",
        ),
        (answer(choice(0, [5], [-0.1]), choice(0, [6], [-0.2])), 2, r"indices \[0, 0\] for n=2"),
        (
            answer(choice(0, [5, 150], [-0.1, -0.2])),
            1,
            r"choice 0: token ids \[150\] are outside the vocabulary \[0, 100\)",
        ),
        (answer(choice(0, [5, -1], [-0.1, -0.2])), 1, r"token ids \[-1\] are outside the vocabulary"),
        (answer(choice(0, [5, 6], [-0.1, 0.7])), 1, r"choice 0: logprobs \[0.7\] are above 0"),
        (answer(choice(0, [5, 6, 7], [-0.1, -0.1, -0.1])), 1, r"choice 0 has 3 tokens, more than max_tokens=2"),
        (answer(choice(0, ["5"], [-0.1])), 1, r"token_ids must be a list of integers"),
        (answer(choice(0, [5], ["-0.1"])), 1, r"token_logprobs must be a list of numbers"),
        ({"choices": [choice(0, [5], [-0.1])], "weight_step": "3"}, 1, r"weight_step must be an integer"),
    ],
    ids=[
        "too few choices",
        "repeated index",
        "id over the vocabulary",
        "negative id",
        "positive logprob",
        "over max_tokens",
        "ids not integers",
        "logprobs not numbers",
        "weight_step not an integer",
    ],
)
def test_a_malformed_answer_is_refused_naming_the_server_and_the_fault(reply, n, fault):
    with ScriptedServer([reply]) as server:
        with pytest.raises(ValueError, match=rf"inference server {server.url}.*{fault}"):
            engine(server.url, max_retries=0, vocab_size=100).generate([[1]], n, SamplingSettings(max_tokens=2))


def test_nonfinite_logprobs_pass_through_to_be_masked_and_counted():
    """NaN and -inf are the orchestrator's counted skip (tests/bad_inputs), not a refusal."""
    with ScriptedServer([answer(choice(0, [5, 6], [float("nan"), float("-inf")]))]) as server:
        [[completion]] = engine(server.url, vocab_size=100).generate([[1]], 1, SamplingSettings(max_tokens=2))
    assert completion.token_ids == [5, 6]


def test_the_vocabulary_is_the_models_tokenizer_by_default(tiny_model):
    from grpokit.common.models import load_tokenizer

    vocab = len(load_tokenizer(tiny_model))
    with ScriptedServer([answer(choice(0, [vocab - 1], [-0.1])), answer(choice(0, [vocab], [-0.1]))]) as server:
        remote = engine(server.url, tiny_model, max_retries=0)
        remote.generate([[1]], 1, SamplingSettings(max_tokens=2))
        assert remote.vocab_size == vocab
        with pytest.raises(ValueError, match=rf"token ids \[{vocab}\] are outside the vocabulary \[0, {vocab}\)"):
            remote.generate([[1]], 1, SamplingSettings(max_tokens=2))


@pytest.mark.parametrize("status", [429, 503])
def test_a_busy_server_is_retried_no_sooner_than_its_retry_after(status, caplog):
    busy = (status, {"Retry-After": "2"}, {"error": {"message": "busy"}})
    with ScriptedServer([busy, answer(choice(0, [5], [-0.5]))]) as server:
        [[completion]] = engine(server.url, max_retries=2, vocab_size=100).generate(
            [[1]], 1, SamplingSettings(max_tokens=2)
        )
    t = server.request_times
    assert completion.token_ids == [5] and len(t) == 2 and t[1] - t[0] >= 2.0  # not the 0.5 s backoff
    assert "retrying in 2.0s" in caplog.text


def test_a_400_is_not_retried():
    with ScriptedServer([(400, {}, {"error": {"message": "n must be <= 8", "param": "n"}})]) as server:
        with pytest.raises(RemoteError, match=r"answered 400: .*n must be <= 8"):
            engine(server.url, max_retries=3).generate([[1]], 1, SamplingSettings(max_tokens=2))
    assert len(server.request_times) == 1


def test_retry_after_values():
    assert retry_after(None) == retry_after("") == retry_after("soon") == 0.0
    assert retry_after("3") == 3.0 and retry_after("-5") == 0.0 and retry_after("86400") == 60.0
    assert retry_after("nan") == 0.0
    in_10s = email.utils.formatdate(time.time() + 10, usegmt=True)
    assert 8.0 <= retry_after(in_10s) <= 10.0
