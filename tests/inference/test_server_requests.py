"""The server's request models (grpokit.inference.server.requests), without a server: strict JSON types,
null as absent, unknown fields ignored, defaults the server cannot honour refused, and the first error
of a body with several answered in the order the hand-written parser they replaced checked them (the
order of the fields, which pydantic takes from the bases, last first)."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest

import grpokit.inference.server as server_package
from grpokit.inference.server.errors import RequestError
from grpokit.inference.server.fields import RequestContext
from grpokit.inference.server.limits import ServerLimits
from grpokit.inference.server.requests import (
    CONTENT_PART,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    SamplingRequest,
)

pytestmark = pytest.mark.unit

USER = [{"role": "user", "content": "hi"}]


class FastEngine:
    """An engine on a path that keeps no top logprobs."""

    reports_top_logprobs = False
    fast = True


CONTEXT = RequestContext(ServerLimits(), "tiny", FastEngine())


def refusal(model, body: dict, context: RequestContext = CONTEXT) -> tuple[str, str | None, int]:
    with pytest.raises(RequestError) as raised:
        model.parse(body, context)
    return raised.value.message, raised.value.param, raised.value.status


@pytest.mark.parametrize(
    ("model", "body", "answer"),
    [
        (ChatCompletionRequest, {"messages": USER, "n": True}, ("n must be an integer, got true", "n", 400)),
        (ChatCompletionRequest, {"messages": USER, "n": 2.0}, ("n must be an integer, got 2.0", "n", 400)),
        (
            ChatCompletionRequest,
            {"messages": USER, "temperature": "1"},
            ('temperature must be a number, got "1"', "temperature", 400),
        ),
        (
            ChatCompletionRequest,
            {"messages": USER, "temperature": -1},
            ("temperature must be 0 or >= 0.01, got -1", "temperature", 400),
        ),
        (
            ChatCompletionRequest,
            {"messages": USER, "temperature": 1e-45},
            ("temperature must be 0 or >= 0.01, got 1e-45", "temperature", 400),
        ),
        (
            ChatCompletionRequest,
            {"messages": USER, "repetition_penalty": 1e300},
            ("repetition_penalty must be in (0, 100], got 1e+300", "repetition_penalty", 400),
        ),
        (ChatCompletionRequest, {"messages": USER, "top_p": 0}, ("top_p must be in (0, 1], got 0", "top_p", 400)),
        (
            ChatCompletionRequest,
            {"messages": USER, "seed": 2**63},
            (f"seed must be in [0, 2**63), got {2**63}", "seed", 400),
        ),
        (
            ChatCompletionRequest,
            {"messages": USER, "n": 257},
            ("n must be >= 1 and <= 256 (server.limits.max_n), got 257", "n", 400),
        ),
        (
            ChatCompletionRequest,
            {"messages": USER, "logprobs": 1},
            ("logprobs must be a boolean, got 1", "logprobs", 400),
        ),
        (
            ChatCompletionRequest,
            {"messages": USER, "chat_template_kwargs": []},
            ("chat_template_kwargs must be an object, got []", "chat_template_kwargs", 400),
        ),
        (
            ChatCompletionRequest,
            {"messages": USER, "stream": True, "stream_options": {"include_usage": "y"}},
            ('include_usage must be a boolean, got "y"', "include_usage", 400),
        ),
        (
            ChatCompletionRequest,
            {"messages": USER, "temperature": 10**400},
            (f"temperature must be a finite number, got {str(10**400)[:60]}", "temperature", 400),
        ),
        (
            ChatCompletionRequest,
            {"model": "gpt-4o", "messages": 1},
            ("the model `gpt-4o` does not exist; this server serves `tiny`", "model", 404),
        ),
        (
            ChatCompletionRequest,
            {"messages": USER, "top_logprobs": 1, "logprobs": True},
            (
                "top_logprobs=1: this server's engine (FastEngine on its fast CUDA path) reports "
                "only the sampled token's logprob; ask for 0",
                "top_logprobs",
                400,
            ),
        ),
        (
            ChatCompletionRequest,
            {"messages": [USER[0], {"role": "user", "content": [{"type": "image_url"}]}]},
            (
                'messages[1].content: only text parts and image parts ({"type": "image_url", "image_url": '
                '{"url": "data:image/png;base64,..."}}) are supported',
                "messages",
                400,
            ),
        ),
        (
            ChatCompletionRequest,
            {"messages": [USER[0], {"role": "user", "content": 3}]},
            ("messages[1].content must be a string or an array of text and image parts", "messages", 400),
        ),
        (
            ChatCompletionRequest,
            {"messages": [USER[0], ["user", "hi"]]},
            ("messages[1] must be an object with a string role", "messages", 400),
        ),
        (
            CompletionRequest,
            {"prompt": [1, True]},
            ("prompt must be a non-empty string, an array of token ids, or an array of either", "prompt", 400),
        ),
        (
            CompletionRequest,
            {"prompt": "x", "stop_token_ids": [1, -1]},
            ("stop_token_ids must be an array of token ids (integers >= 0)", "stop_token_ids", 400),
        ),
        (
            GenerateRequest,
            {"token_ids": [1], "sampling_params": {"logprobs": 2}},
            (
                "logprobs=2: this server's engine (FastEngine on its fast CUDA path) reports "
                "only the sampled token's logprob; ask for 1",
                "logprobs",
                400,
            ),
        ),
        (
            GenerateRequest,
            {"token_ids": [1], "sampling_params": {"bad_words": ["x"]}},
            ("sampling_params.bad_words is not supported by this server", "bad_words", 400),
        ),
        (
            GenerateRequest,
            {"token_ids": [1], "sampling_params": []},
            ("sampling_params must be an object, got []", "sampling_params", 400),
        ),
        (
            GenerateRequest,
            {"token_ids": [1], "features": {"x": 1}},
            (
                "features (vLLM's processed tensors, in its own msgpack per model) is not taken: send the pictures as "
                f"content_parts ({CONTENT_PART}) with the token ids before expansion (renderers' "
                "process_multimodal=False), and the server's processor makes the tensors",
                "features",
                400,
            ),
        ),
        (
            GenerateRequest,
            {"token_ids": [1], "content_parts": {"type": "image_url"}},
            (f"content_parts must be an array of image parts ({CONTENT_PART})", "content_parts", 400),
        ),
        (
            GenerateRequest,
            {"token_ids": [1], "content_parts": [{"type": "image_url", "url": "data:,"}, {"type": "video_url"}]},
            (
                f"content_parts[1] is of type 'video_url': only image parts ({CONTENT_PART}) are taken",
                "content_parts",
                400,
            ),
        ),
    ],
)
def test_each_refusal_names_the_field_and_what_it_takes(model, body, answer):
    assert refusal(model, body) == answer


@pytest.mark.parametrize(
    ("model", "body", "param"),
    [  # several errors: the first the old parser checked is answered
        (ChatCompletionRequest, {"model": 3, "messages": 1}, "model"),
        (ChatCompletionRequest, {"messages": 1, "chat_template_kwargs": {"tokenize": True}}, "messages"),
        (ChatCompletionRequest, {"messages": USER, "chat_template": "x", "logprobs": 1}, "chat_template"),
        (ChatCompletionRequest, {"messages": USER, "top_logprobs": 1, "max_completion_tokens": 0}, "top_logprobs"),
        (ChatCompletionRequest, {"messages": USER, "max_tokens": 0, "echo": True}, "max_tokens"),
        (ChatCompletionRequest, {"messages": USER, "n": 0, "echo": True, "seed": -1}, "echo"),
        (ChatCompletionRequest, {"messages": USER, "n": 0, "seed": -1}, "seed"),
        (ChatCompletionRequest, {"messages": USER, "stream": "yes", "priority": 2**40, "min_tokens": -1}, "min_tokens"),
        (ChatCompletionRequest, {"messages": USER, "stream": "yes", "priority": 2**40}, "priority"),
        (CompletionRequest, {"prompt": "", "logprobs": -1}, "prompt"),
        (CompletionRequest, {"prompt": "x", "max_tokens": 0, "logprobs": -1}, "logprobs"),
        (CompletionRequest, {"prompt": "x", "stop": [1] * 17, "top_p": 2}, "top_p"),
        (GenerateRequest, {"token_ids": [1], "output_mode": "text", "stream": True}, "stream"),
        (GenerateRequest, {"token_ids": [1], "sampling_params": {"n": 0}, "request_id": 5}, "n"),
        (
            GenerateRequest,
            {"token_ids": [1], "sampling_params": {"top_k": 5, "max_tokens": 0, "ignore_eos": True}},
            "ignore_eos",
        ),
        (GenerateRequest, {"token_ids": [1], "sampling_params": {"top_k": 5, "max_tokens": 0}}, "max_tokens"),
    ],
)
def test_of_several_errors_the_first_in_the_old_order_is_answered(model, body, param):
    assert refusal(model, body)[1] == param


BAD = [True] * 1_000_000  # a million bad items: the first is the error, found at once


@pytest.mark.parametrize(
    ("model", "body"),
    [
        (CompletionRequest, {"prompt": BAD}),
        (CompletionRequest, {"prompt": [[True]] * 1_000_000}),
        (CompletionRequest, {"prompt": "x", "stop_token_ids": BAD}),
        (GenerateRequest, {"token_ids": BAD}),
        (ChatCompletionRequest, {"messages": BAD}),
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": BAD}]}),
    ],
    ids=["prompt", "prompts", "stop_token_ids", "token_ids", "messages", "content"],
)
def test_an_array_of_bad_items_is_refused_at_its_first(model, body):
    """Without fail_fast pydantic collects an error per item: seconds and gigabytes for such a body."""
    start = time.monotonic()
    refusal(model, body)
    assert time.monotonic() - start < 1.0


def test_field_order_is_the_endpoints_own_then_sampling_then_stream():
    fields = list(ChatCompletionRequest.model_fields)
    assert fields[:3] == ["model", "messages", "chat_template_kwargs"] and fields[-2:] == ["stream", "stream_options"]
    assert fields.index("max_completion_tokens") < fields.index("max_tokens") < fields.index("echo")
    assert list(CompletionRequest.model_fields)[:5] == ["model", "prompt", "logprobs", "vision", "max_tokens"]


def test_null_is_absent_unknown_fields_are_ignored_and_defaults_of_unsupported_fields_pass():
    body = {"prompt": "x", "n": None, "stop": None, "no_such_field": [1], "top_k": -1, "echo": False}
    body |= {"logit_bias": {}, "response_format": {"type": "text"}, "presence_penalty": 0.0, "temperature": 1}
    request = CompletionRequest.parse(body, CONTEXT)
    params = request.params
    assert request.prompt == ["x"] and params.n == 1 and params.stop == [] and params.max_tokens == 16
    assert params.temperature == 1.0 and isinstance(params.temperature, float) and 0 <= params.seed < 2**63
    assert request.usage is None and not params.logprobs


def test_stream_options_are_read_only_when_streaming():
    plain = ChatCompletionRequest.parse({"messages": USER, "stream_options": 5}, CONTEXT)
    streamed = ChatCompletionRequest.parse({"messages": USER, "stream": True, "stream_options": {}}, CONTEXT)
    assert plain.usage is None and streamed.usage is False


def test_max_completion_tokens_wins_and_max_tokens_is_then_not_read():
    request = ChatCompletionRequest.parse({"messages": USER, "max_completion_tokens": 5, "max_tokens": "x"}, CONTEXT)
    assert request.params.max_tokens == 5
    assert refusal(ChatCompletionRequest, {"messages": USER, "max_completion_tokens": 5, "min_tokens": 6})[0] == (
        "min_tokens must be in [0, max_tokens=5], got 6"
    )


def test_chat_messages_keep_their_fields_and_join_text_parts():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b", "cache_control": {}}]
    messages = [{"name": "x", "role": "user", "content": parts}, {"role": "assistant"}]
    request = ChatCompletionRequest.parse({"messages": messages}, CONTEXT)
    assert request.messages == [
        {"name": "x", "role": "user", "content": "a\nb"},
        {"role": "assistant", "content": None},
    ]


def test_a_template_of_the_requests_own_only_where_trusted():
    body = {"messages": USER, "chat_template_kwargs": {"chat_template": "{{ 'x' }}", "enable_thinking": False}}
    trusted = RequestContext(ServerLimits(trust_request_chat_template=True), "tiny")
    assert ChatCompletionRequest.parse(body, trusted).template_kwargs == {
        "chat_template": "{{ 'x' }}",
        "enable_thinking": False,
    }
    assert refusal(ChatCompletionRequest, body)[1] == "chat_template_kwargs"
    assert refusal(ChatCompletionRequest, {**body, "chat_template": ""}, trusted) == (
        "chat_template must be a non-empty string",
        "chat_template",
        400,
    )


def test_generate_reads_sampling_params_and_shows_the_sampled_token_first():
    body = {"token_ids": [1, 2], "sampling_params": {"logprobs": 1, "n": 2, "stop_token_ids": [3, 3, 4]}}
    request = GenerateRequest.parse(body, CONTEXT)
    params = request.sampling_params.params
    assert request.token_ids == [1, 2] and params.logprobs and params.top_logprobs == 0  # k=1: the sampled token
    assert params.n == 2 and params.stop_token_ids == [3, 4] and request.request_id is None


def test_sampling_request_parse_keeps_its_signature():
    params = SamplingRequest.parse({"min_tokens": 2, "temperature": 0}, 4, True, ServerLimits(), 3)
    assert (params.max_tokens, params.min_tokens, params.logprobs, params.top_logprobs) == (4, 2, True, 3)


def test_the_http_layer_is_imported_by_the_api_never_the_other_way():
    """asgi.py serves any app with `dispatch`: it imports nothing of http.py, not even for type checks."""
    tree = ast.parse((Path(server_package.__file__).parent / "asgi.py").read_text())
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert "grpokit.inference.server.http" not in imported
