"""`stream: true`: an answer as OpenAI's server-sent events (`data: {chunk}` lines, then `data: [DONE]`).

The engine samples a request whole (InferenceEngine.generate has no per-token callback), so the events are
made from the finished answer: per choice, a first chunk (chat: the assistant role), one chunk with the
whole text and its logprobs (and vLLM's `token_ids` when `return_token_ids`), and a last chunk with the
finish reason; with `stream_options.include_usage`, a usage chunk before `[DONE]`. Clients that join the
deltas get exactly the non-streamed answer: the format of streaming, without its latency.
"""

from __future__ import annotations

import json
from collections.abc import Iterator


def _base(answer: dict, kind: str) -> dict:
    return {
        "id": answer["id"],
        "object": kind,
        "created": answer["created"],
        "model": answer["model"],
        "weight_step": answer["weight_step"],
    }


def chat_chunks(answer: dict, include_usage: bool) -> list[dict]:
    """A chat.completion answer as chat.completion.chunk events."""
    base, events = _base(answer, "chat.completion.chunk"), []
    for choice in answer["choices"]:
        i = choice["index"]
        first = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        text = {"index": i, "delta": {"content": choice["message"]["content"]}, "logprobs": choice["logprobs"]}
        text["finish_reason"] = None
        if "token_ids" in choice:
            text["token_ids"] = choice["token_ids"]
        last = {"index": i, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]}
        events += [{**base, "choices": [first]}, {**base, "choices": [text]}, {**base, "choices": [last]}]
    if "prompt_token_ids" in answer and events:
        events[0]["prompt_token_ids"] = answer["prompt_token_ids"]
    if include_usage:
        events.append({**base, "choices": [], "usage": answer["usage"]})
    return events


def completion_chunks(answer: dict, include_usage: bool) -> list[dict]:
    """A text_completion answer as text_completion events, one per choice."""
    base = _base(answer, "text_completion")
    events = [{**base, "choices": [choice]} for choice in answer["choices"]]
    if include_usage:
        events.append({**base, "choices": [], "usage": answer["usage"]})
    return events


def server_sent_events(events: list[dict]) -> Iterator[bytes]:
    for event in events:
        yield b"data: " + json.dumps(event).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"
