"""The API a client expects beyond plain requests: the official `openai` client streams chat and text
completions token by token (server-sent events that join to the plain answer), top logprobs in OpenAI's
shapes, and vLLM's token-in/token-out `/inference/v1/generate` returns the same token ids and logprobs
(top ones too) as the chat route for the same request, in vLLM's generate shapes (`token_id:<id>`)."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request

import pytest

from grpokit.inference import NewTokens
from tests.support import serving

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
    kwargs = {
        "model": "tiny",
        "prompt": PROMPT_IDS,
        "logprobs": 2,
        **SAMPLING,
        "extra_body": {"return_token_ids": True},
    }
    plain = client.completions.create(**kwargs)
    text, tokens, logprobs, top, offsets, token_ids, finish = ({0: [], 1: []} for _ in range(7))
    for chunk in client.completions.create(**kwargs, stream=True):
        assert chunk.object == "text_completion" and chunk.weight_step == -1
        for c in chunk.choices:
            text[c.index].append(c.text)
            token_ids[c.index] += getattr(c, "token_ids", None) or []
            finish[c.index].append(c.finish_reason)
            if c.logprobs:
                tokens[c.index] += c.logprobs.tokens
                logprobs[c.index] += c.logprobs.token_logprobs
                top[c.index] += c.logprobs.top_logprobs
                offsets[c.index] += c.logprobs.text_offset
    for c in plain.choices:
        assert len([t for t in text[c.index] if t]) > 1  # token by token, not the whole answer at once
        assert "".join(text[c.index]) == c.text and token_ids[c.index] == c.token_ids
        assert finish[c.index][-1] == c.finish_reason and set(finish[c.index][:-1]) == {None}
        assert tokens[c.index] == c.logprobs.tokens and logprobs[c.index] == c.logprobs.token_logprobs
        assert top[c.index] == c.logprobs.top_logprobs and offsets[c.index] == c.logprobs.text_offset


@contextlib.contextmanager
def slow_decode(engine, seconds: float):
    """Every forward of the engine's model (prefill and each decode step) takes `seconds` longer."""
    forward = engine.model.forward

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return forward(*args, **kwargs)

    engine.model.forward = slow
    try:
        yield
    finally:
        del engine.model.forward


def test_a_stream_sends_each_token_as_it_is_decoded(served, client):
    engine, _ = served
    arrivals, start = [], time.monotonic()
    with slow_decode(engine, 0.1):
        stream = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, stream=True
        )
        for chunk in stream:
            for c in chunk.choices:
                if c.delta.content or c.finish_reason:
                    arrivals.append(time.monotonic() - start)
    # 12 forwards of >= 0.1 s: the first text arrives after one or two of them, not after all
    assert arrivals[-1] > 1.1 and arrivals[0] < arrivals[-1] - 0.6 and len(arrivals) >= 4


def test_chat_top_logprobs_in_openais_shape(served, client):
    engine, _ = served
    kwargs = {"model": "tiny", "messages": MESSAGES, "logprobs": True, "top_logprobs": 3, **SAMPLING}
    r = client.chat.completions.create(**kwargs, extra_body={"return_token_ids": True})
    for choice in r.choices:
        for token_id, item in zip(choice.token_ids, choice.logprobs.content, strict=True):
            assert item.token == engine.tokenizer.decode([token_id]) and item.bytes == list(item.token.encode())
            values = [t.logprob for t in item.top_logprobs]
            assert len(values) == 3 and values == sorted(values, reverse=True) and item.logprob <= values[0] + 1e-6
            assert all(t.bytes == list(t.token.encode()) for t in item.top_logprobs)
    streamed = [
        item
        for chunk in client.chat.completions.create(**kwargs, stream=True)
        for c in chunk.choices
        if c.index == 0 and c.logprobs
        for item in c.logprobs.content
    ]
    assert [x.top_logprobs for x in streamed] == [x.top_logprobs for x in r.choices[0].logprobs.content]


def test_generate_returns_the_chat_routes_token_ids_and_logprobs(served):
    engine, server = served
    status, chat = post(
        server, "/v1/chat/completions", {"messages": MESSAGES, "logprobs": True, **SAMPLING, "return_token_ids": True}
    )
    assert status == 200
    body = {"token_ids": chat["prompt_token_ids"], "sampling_params": {**SAMPLING, "logprobs": 0}, "request_id": "r1"}
    status, generated = post(server, "/inference/v1/generate", body)
    assert status == 200 and generated["request_id"] == "r1" and generated["prompt_logprobs"] is None
    assert generated["weight_step"] == chat["weight_step"] == -1 and generated["usage"] == chat["usage"]
    for g, c in zip(generated["choices"], chat["choices"], strict=True):
        assert g["index"] == c["index"] and g["finish_reason"] == c["finish_reason"]
        assert g["token_ids"] == c["token_ids"] and len(g["token_ids"]) == 5
        for t, item, expected in zip(g["token_ids"], g["logprobs"]["content"], c["logprobs"]["content"], strict=True):
            sampled = {"token": f"token_id:{t}", "token_id": t, "logprob": expected["logprob"], "bytes": None}
            assert item == {**sampled, "top_logprobs": [sampled]}  # vLLM: max(k, 1) entries, the sampled first
    chat_body = {"messages": MESSAGES, "logprobs": True, "top_logprobs": 4, **SAMPLING}
    status, chat = post(server, "/v1/chat/completions", chat_body)
    sampling = {**SAMPLING, "logprobs": 4}
    status, generated = post(server, "/inference/v1/generate", {**body, "sampling_params": sampling})
    assert status == 200
    for g, c in zip(generated["choices"], chat["choices"], strict=True):
        for t, item, expected in zip(g["token_ids"], g["logprobs"]["content"], c["logprobs"]["content"], strict=True):
            top = item["top_logprobs"]  # the sampled token, then the most likely others: 4 in all
            assert len(top) == 4 and (top[0]["token_id"], top[0]["logprob"]) == (t, expected["logprob"])
            assert all(x["token"] == f"token_id:{x['token_id']}" and x["bytes"] is None for x in top)
            assert len({x["token_id"] for x in top}) == 4
            values = [x["logprob"] for x in expected["top_logprobs"]]  # the chat route's top 4
            if expected["logprob"] in values:
                values.remove(expected["logprob"])
            assert [x["logprob"] for x in top[1:]] == values[:3]
    prompt = PROMPT_IDS * 126  # 504 tokens: the rest of the 512-token context is 8
    status, plain = post(server, "/inference/v1/generate", {"token_ids": prompt})  # vLLM's default: the rest
    assert status == 200 and plain["choices"][0]["logprobs"] is None and plain["prompt_token_ids"] is None
    assert len(plain["choices"][0]["token_ids"]) <= 8 and plain["usage"]["prompt_tokens"] == 504


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"sampling_params": {}}, "token_ids", "non-empty array of token ids"),
        ({"token_ids": [1, 10**9]}, "token_ids", "token_ids must be in [0, 49152)"),
        ({"token_ids": PROMPT_IDS, "stream": True}, "stream", "not supported on /inference/v1/generate"),
        ({"token_ids": PROMPT_IDS, "sampling_params": {"n": 10**6}}, "n", "server.limits.max_n"),
        ({"token_ids": PROMPT_IDS, "sampling_params": {"logprobs": 21}}, "logprobs", "server.limits.max_top_logprobs"),
        ({"token_ids": PROMPT_IDS, "sampling_params": {"stop": ["x"] * 17}}, "stop", "server.limits.max_stop"),
        ({"token_ids": PROMPT_IDS, "sampling_params": {"max_tokens": 600}}, "max_tokens", "context is 512"),
        ({"token_ids": PROMPT_IDS, "model": "other"}, "model", "does not exist"),
        ({"token_ids": PROMPT_IDS, "sampling_params": {"stop_token_ids": [2, 10**9]}}, "stop_token_ids", "[0, 49152)"),
        ({"token_ids": PROMPT_IDS, "sampling_params": {"stop_token_ids": 2}}, "stop_token_ids", "array of token ids"),
        ({"token_ids": PROMPT_IDS, "sampling_params": {"ignore_eos": True}}, "ignore_eos", "not supported"),
        ({"token_ids": PROMPT_IDS, "sampling_params": {"top_k": 20}}, "top_k", "not supported"),
        ({"token_ids": PROMPT_IDS, "features": {"mm_hashes": {}}}, "features", "send the pictures as content_parts"),
        ({"token_ids": PROMPT_IDS, "content_parts": [{"type": "image_url", "url": "x"}]}, "content_parts", "text-only"),
        ({"token_ids": PROMPT_IDS, "output_mode": "text"}, "output_mode", "returns no text"),
    ],
)
def test_generate_refusals_name_the_field(served, body, param, message):
    status, payload = post(served[1], "/inference/v1/generate", body)
    assert status in (400, 404) and payload["error"]["param"] == param and message in payload["error"]["message"]


def test_generate_ignores_what_vllm_ignores_or_only_formats_text(served):
    body = {"token_ids": PROMPT_IDS, "sampling_params": {**SAMPLING, "logprobs": 1}}
    status, plain = post(served[1], "/inference/v1/generate", body)
    extra = {"skip_special_tokens": False, "include_stop_str_in_output": True, "detokenize": False}
    extra |= {"routed_experts_prompt_start": 3, "reasoning_effort": "low", "no_such_field": 1}  # vLLM drops these
    body = {**body, "sampling_params": {**body["sampling_params"], **extra}, "priority": 5, "cache_salt": "s"}
    status2, same = post(served[1], "/inference/v1/generate", {**body, "kv_transfer_params": {}})
    assert status == status2 == 200 and [c["token_ids"] for c in same["choices"]] == [
        c["token_ids"] for c in plain["choices"]
    ]
    assert [c["logprobs"] for c in same["choices"]] == [c["logprobs"] for c in plain["choices"]]


def test_a_stream_refused_before_its_first_event_is_a_json_error_and_a_later_failure_an_error_event(served):
    engine, server = served
    status, payload = post(server, "/v1/completions", {"prompt": PROMPT_IDS, "max_tokens": 510, "stream": True})
    assert (
        status == 400
        and payload["error"]["param"] == "max_tokens"
        and "leave room for 508" in payload["error"]["message"]
    )
    generate = engine.generate

    def fails_midway(prompts, n, sampling, options=None):
        options.on_tokens([NewTokens(0, [42], [-0.5])])
        raise RuntimeError("the engine broke")

    engine.generate = fails_midway
    try:
        request = urllib.request.Request(
            server.url + "/completions",
            data=json.dumps({"prompt": PROMPT_IDS, "stream": True}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as r:
            events = [line.removeprefix(b"data: ") for line in r.read().split(b"\n\n") if line]
    finally:
        engine.generate = generate
    assert r.status == 200 and events[-1] == b"[DONE]"
    assert json.loads(events[0])["choices"][0]["text"] == engine.tokenizer.decode([42])
    assert "the engine broke" in json.loads(events[-2])["error"]["message"]
