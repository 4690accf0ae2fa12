"""Parsing and validating the bodies of OpenAI API requests for grpokit's server (grpokit.inference.server.http):
typed fields with errors that name the field, the sampling parameters, chat messages and prompts.
Anything the server cannot honour is refused (400), never silently ignored."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Fields whose non-default value would change the result in a way this server cannot honour: refused.
UNSUPPORTED = {
    "stream": (False,),
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
TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", dict: "an object"}


class RequestError(Exception):
    """A client error, answered with `status` and an OpenAI-style error body naming `param`."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status

    def body(self) -> dict:
        kind = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed", 413: "RequestTooLarge"}
        return {
            "error": {
                "message": self.message,
                "type": kind.get(self.status, "ServiceUnavailable"),
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
    if check is not None and not check(value):
        raise RequestError(f"{name} must be {requirement}, got {value!r}", name)
    return float(value) if kind is float else value


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

    @classmethod
    def parse(cls, body: dict, max_tokens: int | None, logprobs: bool) -> SamplingRequest:
        for name, off in UNSUPPORTED.items():
            if body.get(name) is not None and body[name] not in off:
                raise RequestError(f"{name} is not supported", name)
        stop = body.get("stop")
        stop = [stop] if isinstance(stop, str) else stop if stop is not None else []
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise RequestError("stop must be a non-empty string or an array of them", "stop")
        seed = field(body, "seed", int, None, lambda v: 0 <= v < 2**63, "in [0, 2**63)")
        return cls(
            n=field(body, "n", int, 1, lambda v: v >= 1, ">= 1"),
            max_tokens=max_tokens,
            temperature=field(body, "temperature", float, 1.0, lambda v: v >= 0, ">= 0"),
            top_p=field(body, "top_p", float, 1.0, lambda v: 0 < v <= 1, "in (0, 1]"),
            stop=stop,
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
        )


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
