"""The API a client expects beyond plain requests: the official `openai` client streams chat and text
completions (server-sent events equal to the plain answer), and vLLM's token-in/token-out
`/inference/v1/generate` returns the same token ids and logprobs as the chat route for the same request."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from grpokit.testing import serving

MESSAGES = [{"role": "user", "content": "Reverse the text: hello"}]
PROMPT_IDS = [1, 520, 9531, 198]
SAMPLING = {"n": 2, "max_tokens": 5, "temperature": 0.7, "seed": 3}


@pytest.fixture(scope="module")
def served(tiny_model):
    with serving(tiny_model) as (engine, server):
        yield engine, server


@pytest.fixture
def client(served):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=served[1].url, api_key="unused", max_retries=0, timeout=120)


def post(server, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        server.url.removesuffix("/v1") + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_openai_client_streams_a_chat_completion_equal_to_the_plain_answer(client):
    kwargs = {"model": "tiny", "messages": MESSAGES, "logprobs": True, "extra_body": {"return_token_ids": True}}
    plain = client.chat.completions.create(**kwargs, **SAMPLING)
    stream = client.chat.completions.create(**kwargs, **SAMPLING, stream=True, stream_options={"include_usage": True})
    content, logprobs, finish, usage = {0: "", 1: ""}, {0: [], 1: []}, {}, None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk" and chunk.id == chunk.id
        usage = chunk.usage or usage
        for choice in chunk.choices:
            content[choice.index] += choice.delta.content or ""
            logprobs[choice.index] += [c.logprob for c in (choice.logprobs.content if choice.logprobs else [])]
            finish[choice.index] = choice.finish_reason or finish.get(choice.index)
    for c in plain.choices:
        assert content[c.index] == c.message.content and finish[c.index] == c.finish_reason
        assert logprobs[c.index] == [x.logprob for x in c.logprobs.content] and len(logprobs[c.index]) == 5
    assert usage.completion_tokens == plain.usage.completion_tokens == 10


def test_the_openai_client_streams_a_text_completion(client):
    kwargs = {"model": "tiny", "prompt": PROMPT_IDS, "logprobs": 0, **SAMPLING}
    plain = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True))
    assert [c.choices[0].text for c in chunks] == [c.text for c in plain.choices]
    assert [c.choices[0].logprobs.token_logprobs for c in chunks] == [c.logprobs.token_logprobs for c in plain.choices]


def test_generate_returns_the_chat_routes_token_ids_and_logprobs(served):
    engine, server = served
    status, chat = post(
        server, "/v1/chat/completions", {"messages": MESSAGES, "logprobs": True, **SAMPLING, "return_token_ids": True}
    )
    assert status == 200
    body = {"token_ids": chat["prompt_token_ids"], "sampling_params": {**SAMPLING, "logprobs": 0}, "request_id": "r1"}
    status, generated = post(server, "/inference/v1/generate", body)
    assert status == 200 and generated["request_id"] == "r1" and generated["prompt_logprobs"] is None
    assert generated["weight_step"] == chat["weight_step"] == -1
    for g, c in zip(generated["choices"], chat["choices"], strict=True):
        assert g["index"] == c["index"] and g["finish_reason"] == c["finish_reason"]
        assert g["token_ids"] == c["token_ids"] and len(g["token_ids"]) == 5
        assert g["logprobs"]["content"] == c["logprobs"]["content"]
    status, plain = post(server, "/inference/v1/generate", {"token_ids": PROMPT_IDS})  # vLLM's defaults: 16 tokens
    assert status == 200 and plain["choices"][0]["logprobs"] is None and len(plain["choices"][0]["token_ids"]) <= 16


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"sampling_params": {}}, "token_ids", "non-empty array of token ids"),
        ({"token_ids": [1, 10**9]}, "token_ids", "token_ids must be in [0, 49152)"),
        ({"token_ids": PROMPT_IDS, "stream": True}, "stream", "not supported on /inference/v1/generate"),
        ({"token_ids": PROMPT_IDS, "sampling_params": {"n": 10**6}}, "n", "server.limits.max_n"),
        ({"token_ids": PROMPT_IDS, "sampling_params": {"logprobs": 5}}, "logprobs", "the sampled token only"),
        ({"token_ids": PROMPT_IDS, "sampling_params": {"max_tokens": 600}}, "max_tokens", "context is 512"),
        ({"token_ids": PROMPT_IDS, "model": "other"}, "model", "does not exist"),
    ],
)
def test_generate_refusals_name_the_field(served, body, param, message):
    status, payload = post(served[1], "/inference/v1/generate", body)
    assert status in (400, 404) and payload["error"]["param"] == param and message in payload["error"]["message"]
