"""Parsing and validating the bodies of OpenAI API requests for grpokit's server (grpokit.inference.server.http):
typed fields with errors that name the field, the sampling parameters, chat messages and prompts.
Anything the server cannot honour is refused (400), never silently ignored."""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from grpokit.inference.server.limits import ServerLimits

# Fields whose non-default value would change the result in a way this server cannot honour: refused.
UNSUPPORTED = {
    "echo": (False,),
    "best_of": (1,),
    "suffix": ("",),
    "logit_bias": ({},),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "top_k": (-1, 0),
    "min_p": (0,),
    "tools": ([],),
    "response_format": ({"type": "text"},),
}
# vLLM SamplingParams fields that change what /inference/v1/generate samples and that grpokit's engines do
# not do: a value other than these (vLLM's defaults) is refused. `()`: any value but null is.
GENERATE_UNSUPPORTED = {
    "ignore_eos": (False,),
    "allowed_token_ids": (),
    "bad_words": ([],),
    "structured_outputs": (),
    "prompt_logprobs": (),
    "logprob_token_ids": (),
    "prompt_logprob_token_ids": (),
    "truncate_prompt_tokens": (),
    "thinking_token_budget": (),
    "trace_decode_token_ids": (),
    "repetition_detection": (),
}
TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", dict: "an object"}


ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    408: "RequestTimeout",
    413: "RequestTooLarge",
    429: "RateLimitError",
    503: "ServiceUnavailable",
}


class RequestError(Exception):
    """A client error (or an overloaded or stopping server), answered with `status` and an OpenAI-style
    error body naming `param`; `retry_after` (seconds) becomes a Retry-After header."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, retry_after: int | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.retry_after = message, param, status, retry_after

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": ERROR_TYPES.get(self.status, "ServiceUnavailable"),
                "param": self.param,
                "code": self.status,
            }
        }


def field(
    body: dict,
    name: str,
    kind: type,
    default: Any = None,
    check: Callable[[Any], bool] | None = None,
    requirement: str = "",
) -> Any:
    """body[name] if it is of `kind` and passes `check`, `default` when absent or null; else a RequestError."""
    value = body.get(name)
    if value is None:
        return default
    accepted = (int, float) if kind is float else kind
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, accepted):
        raise RequestError(f"{name} must be {TYPE_NAMES[kind]}, got {json.dumps(value)[:60]}", name)
    if kind is float and not math.isfinite(value):
        raise RequestError(f"{name} must be a finite number, got {json.dumps(value)}", name)
    if check is not None and not check(value):
        raise RequestError(f"{name} must be {requirement}, got {value!r}", name)
    return float(value) if kind is float else value


def parse_json(body: bytes) -> Any:
    """The request body as JSON; a 400 (never a 500) for bytes that are not JSON or nest too deeply."""
    try:
        return json.loads(body or b"null")
    except RecursionError:
        raise RequestError("request body nests JSON arrays or objects too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(f"request body is not valid JSON: {e}") from None


@dataclass
class SamplingRequest:
    """The sampling fields both endpoints share, checked."""

    n: int
    max_tokens: int | None
    temperature: float
    top_p: float
    stop: list[str]
    seed: int
    logprobs: bool
    return_token_ids: bool
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    top_logprobs: int = 0
    stop_token_ids: list[int] = dataclass_field(default_factory=list)
    priority: int = 0  # vLLM's field: lower is served first (the engine queue's order, EngineWorker.submit)

    @classmethod
    def parse(
        cls, body: dict, max_tokens: int | None, logprobs: bool, limits: ServerLimits, top_logprobs: int = 0
    ) -> SamplingRequest:
        """The sampling fields of `body`; `logprobs` and `top_logprobs` as the endpoint has read them."""
        for name, off in UNSUPPORTED.items():
            if body.get(name) is not None and body[name] not in off:
                raise RequestError(f"{name} is not supported", name)
        seed = field(body, "seed", int, None, lambda v: 0 <= v < 2**63, "in [0, 2**63)")
        max_n = limits.max_n
        return cls(
            n=field(body, "n", int, 1, lambda v: 1 <= v <= max_n, f">= 1 and <= {max_n} (server.limits.max_n)"),
            max_tokens=max_tokens,
            temperature=field(body, "temperature", float, 1.0, lambda v: v >= 0, ">= 0"),
            top_p=field(body, "top_p", float, 1.0, lambda v: 0 < v <= 1, "in (0, 1]"),
            stop=parse_stop(body, limits),
            seed=secrets.randbits(63) if seed is None else seed,
            logprobs=logprobs,
            return_token_ids=field(body, "return_token_ids", bool, False),
            min_tokens=field(
                body,
                "min_tokens",
                int,
                0,
                lambda v: v >= 0 and (max_tokens is None or v <= max_tokens),
                f"in [0, max_tokens={max_tokens}]",
            ),
            repetition_penalty=field(body, "repetition_penalty", float, 1.0, lambda v: v > 0, "> 0"),
            top_logprobs=top_logprobs,
            stop_token_ids=parse_stop_token_ids(body),
            priority=field(body, "priority", int, 0, lambda v: -(2**31) <= v < 2**31, "a 32-bit integer"),
        )


def parse_stop_token_ids(body: dict) -> list[int]:
    """`stop_token_ids` (vLLM's extension): token ids that end a completion besides EOS, each once, in order
    (the app checks them against the vocabulary)."""
    ids = body.get("stop_token_ids")
    if ids is None:
        return []
    if not isinstance(ids, list) or not all(type(t) is int and t >= 0 for t in ids):
        raise RequestError("stop_token_ids must be an array of token ids (integers >= 0)", "stop_token_ids")
    return list(dict.fromkeys(ids))


def parse_stop(body: dict, limits: ServerLimits) -> list[str]:
    """`stop`: a string or an array of them, non-empty, at most server.limits.max_stop of them and
    max_stop_chars characters each (every decode step searches the text for each)."""
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if isinstance(stop, list) and len(stop) > limits.max_stop:
        raise RequestError(
            f"{len(stop)} stop strings, over the limit of {limits.max_stop} (server.limits.max_stop)", "stop"
        )
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("stop must be a non-empty string or an array of them", "stop")
    longest = max(map(len, stop), default=0)
    if longest > limits.max_stop_chars:
        raise RequestError(
            f"a stop string of {longest} characters, over the limit of {limits.max_stop_chars} "
            "(server.limits.max_stop_chars)",
            "stop",
        )
    return stop


def parse_messages(body: dict) -> list[dict]:
    """Chat messages with text content; content parts are joined, as vLLM does for text models."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty array of {role, content} objects", "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string role", "messages")
        content = message.get("content")
        if isinstance(content, list):
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
            ):
                raise RequestError(f"messages[{i}].content: only text parts are supported", "messages")
            content = "\n".join(p["text"] for p in content)
        elif content is not None and not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string or an array of text parts", "messages")
        out.append({**message, "content": content})
    return out


def parse_prompts(body: dict) -> list[str | list[int]]:
    """A completions `prompt`: a string, token ids, or an array of either (one choice group per prompt)."""

    def is_one(p: Any) -> bool:
        return (isinstance(p, str) and p != "") or (isinstance(p, list) and p != [] and all(type(t) is int for t in p))

    prompt = body.get("prompt")
    if is_one(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(is_one(p) for p in prompt):
        return prompt
    raise RequestError("prompt must be a non-empty string, an array of token ids, or an array of either", "prompt")


# apply_chat_template's own parameters: the server sets them (or they change what it returns), so a
# request's chat_template_kwargs may not.
RESERVED_TEMPLATE_KWARGS = {
    "conversation",
    "tokenize",
    "return_dict",
    "add_generation_prompt",
    "return_tensors",
    "padding",
    "truncation",
    "max_length",
    "tokenizer_kwargs",
    "return_assistant_tokens_mask",
}


def parse_template_kwargs(body: dict, trusted: bool) -> dict:
    """`chat_template_kwargs` (variables for the chat template), and a request's own template (vLLM's
    `chat_template` field or `chat_template_kwargs.chat_template`) only where the server trusts them."""
    kwargs = field(body, "chat_template_kwargs", dict, {})
    own, nested = body.get("chat_template"), kwargs.get("chat_template")
    template, param = (own, "chat_template") if own is not None else (nested, "chat_template_kwargs")
    if template is not None:
        if not trusted:
            raise RequestError(
                "this server renders only its own chat template: a template sent in the request is refused "
                "(start the server with --server.limits.trust_request_chat_template true to allow it)",
                param,
            )
        if not isinstance(template, str) or not template:
            raise RequestError("chat_template must be a non-empty string", param)
        kwargs = {**kwargs, "chat_template": template}
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(kwargs))
    if reserved:
        raise RequestError(
            f"chat_template_kwargs.{reserved[0]} is set by the server, not by the request", "chat_template_kwargs"
        )
    return kwargs


@dataclass(frozen=True)
class PromptBudget:
    """How long one prompt may be, checked before the engine's work: at most `max_tokens` tokens and, before
    tokenising, at most `max_chars` characters of text. No token spans more characters than the longest
    vocabulary entry (`token_chars`; true of byte-level BPE and SentencePiece, whose entries are the
    text's bytes or characters), so a longer text has more tokens than the limit and is refused unread.
    `source` names where the limit comes from, for the error."""

    max_tokens: int | None
    token_chars: int
    source: str

    @classmethod
    def of(cls, context: int | None, max_prompt_tokens: int | None, token_chars: int) -> PromptBudget:
        limits = [(max_prompt_tokens, "server.limits.max_prompt_tokens")]
        if context is not None:
            limits.append((context - 1, f"this model's context of {context} tokens, less one for the completion"))
        limit, source = min(((v, s) for v, s in limits if v is not None), default=(None, "no limit"))
        return cls(limit, max(1, token_chars), source)

    @property
    def max_chars(self) -> int | None:
        return None if self.max_tokens is None else self.max_tokens * self.token_chars

    def check_tokens(self, count: int, param: str) -> None:
        if self.max_tokens is not None and count > self.max_tokens:
            raise RequestError(
                f"the prompt has {count} tokens, over the limit of {self.max_tokens} ({self.source})", param
            )

    def check_text(self, chars: int, param: str) -> None:
        if self.max_chars is not None and chars > self.max_chars:
            raise RequestError(
                f"the prompt has {chars} characters: more than {self.max_tokens} tokens, the limit "
                f"({self.source}), since no token spans more than {self.token_chars} characters",
                param,
            )

    def check_prompts(self, prompts: list[str | list[int]], vocab_size: int, param: str = "prompt") -> None:
        """Prompts (the field `param`): token ids within the vocabulary and the limit, texts within `max_chars`."""
        for p in prompts:
            if isinstance(p, str):
                self.check_text(len(p), param)
                continue
            self.check_tokens(len(p), param)
            if not all(0 <= t < vocab_size for t in p):
                what = "prompt token ids" if param == "prompt" else param
                raise RequestError(f"{what} must be in [0, {vocab_size})", param)

    def check_messages(self, messages: list[dict]) -> None:
        """Chat messages: no more than the token limit (each renders to at least one token), and their
        text (every field's) within `max_chars` (the template only adds to it)."""
        self.check_tokens(len(messages), "messages")
        self.check_text(sum(len(str(v)) for m in messages for v in m.values() if v is not None), "messages")


def check_rows(prompts: int, n: int, max_rows: int) -> None:
    """prompts x n, the rows the engine samples for one request, within server.limits.max_rows."""
    if prompts * n > max_rows:
        raise RequestError(
            f"{prompts} prompts x n={n} = {prompts * n} completions in one request, over "
            f"server.limits.max_rows={max_rows}: split the request",
            "n" if prompts == 1 else "prompt",
        )


def longest_token_chars(tokenizer) -> int:
    """Characters in the tokenizer's longest vocabulary entry, added tokens included."""
    return max(map(len, tokenizer.get_vocab()), default=1)


def parse_stream(body: dict) -> bool | None:
    """None for a plain answer; else whether a streamed answer ends with a usage chunk."""
    if not field(body, "stream", bool, False):
        return None
    return field(field(body, "stream_options", dict, {}), "include_usage", bool, False)


def parse_token_ids(body: dict, name: str) -> list[int]:
    ids = body.get(name)
    if not isinstance(ids, list) or not ids or not all(type(t) is int for t in ids):
        raise RequestError(f"{name} must be a non-empty array of token ids", name)
    return ids
