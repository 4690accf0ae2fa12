"""`stream: true`: an answer as OpenAI's server-sent events (`data: {chunk}` lines, then `data: [DONE]`),
sent token by token as the engine decodes them.

The engine hands each decode step's new tokens to `on_tokens` (ServingOptions, on the engine thread);
each choice that gained tokens gets a chunk with its text delta, and its logprobs (with top
alternatives) and vLLM's `token_ids` when asked for. The chunks go, as bytes, to `emit`, which the HTTP
layer (grpokit.inference.server.asgi) writes to the client. Per choice: a first chunk (chat: the
assistant role), the deltas, and a last chunk with the rest of the text and the finish reason; with
`stream_options.include_usage`, a usage chunk before `[DONE]`. A client that joins the deltas gets
exactly the non-streamed answer's text, tokens and logprobs.

Text is decoded a few tokens at a time (TextDeltas, as vLLM's incremental detokenizer): a delta never
ends in an incomplete UTF-8 character, never shows a stop string (the answer's text ends before it),
and holds back an end that may yet become one. Engines that cannot follow the decode loop (the fast
CUDA path, engines without `takes_serving_options`) hand over each completion whole when it ends.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection

from grpokit.inference import Completion, NewTokens
from grpokit.inference.server.answers import Answers, finish_reason, new_id, usage

log = logging.getLogger(__name__)
DONE = b"data: [DONE]\n\n"


def sse(event: dict) -> bytes:
    """One server-sent event."""
    return b"data: " + json.dumps(event).encode() + b"\n\n"


class TextDeltas:
    """One choice's text as its tokens arrive: the part of it that is final, a delta at a time.

    Decoding: the new text is decode(ids[prefix:]) less decode(ids[prefix:read]), taken only when it does
    not end in "\\ufffd" (a character whose bytes have not all arrived); a short window keeps each step's
    cost flat while a tokenizer that merges across tokens (SentencePiece's spaces) decodes as a whole.
    Stop strings: the text is final up to its first stop string, and up to the earliest end that is
    the beginning of one (it may yet complete, and the answer would end there)."""

    def __init__(self, decode: Callable[[list[int]], str], stop: list[str]) -> None:
        self.decode, self.stop = decode, stop
        self.longest_stop = max(map(len, stop), default=0)
        self.ids: list[int] = []
        self.prefix = self.read = 0
        self.text = ""
        self.cut: int | None = None  # where the first stop string found so far begins
        self.sent = 0

    def add(self, token_ids: list[int]) -> str:
        """The text the new tokens make final (may be empty)."""
        self.ids += token_ids
        before = self.decode(self.ids[self.prefix : self.read])
        after = self.decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            checked = len(self.text)
            self.text += after[len(before) :]
            self.prefix, self.read = self.read, len(self.ids)
            for s in self.stop:  # a new occurrence ends in the new text
                i = self.text.find(s, max(0, checked - len(s) + 1))
                if i >= 0 and (self.cut is None or i < self.cut):
                    self.cut = i
        ready = min(self.cut if self.cut is not None else len(self.text), self._partial_stop())
        delta = self.text[self.sent : ready]
        self.sent = max(self.sent, ready)
        return delta

    def _partial_stop(self) -> int:
        """The earliest position from which the text is a proper beginning of a stop string."""
        text, earliest = self.text, len(self.text)
        if not text:
            return earliest
        last = text[-1]
        for s in self.stop:
            for m in range(min(len(s) - 1, len(text)), 0, -1):  # longest first: the earliest start
                if s[m - 1] == last and text.endswith(s[:m]):
                    earliest = min(earliest, len(text) - m)
                    break
        return earliest

    def rest(self, final: str) -> str:
        """What is left to send of the answer's text `final`."""
        if not final.startswith(self.text[: self.sent]):  # a tokenizer whose text of a prefix is no prefix
            log.warning("a streamed text delta differs from the final text: %r", self.text[: self.sent][-40:])
        return final[self.sent :]


class AnswerStream:
    """The chunks of one streamed answer, made on the engine thread; see the module docstring."""

    kind, prefix = "", ""  # the chunks' `object`, and their id's prefix

    def __init__(
        self,
        answers: Answers,
        emit: Callable[[bytes], None],
        prompts: list[list[int]],
        n: int,
        stop: list[str],
        logprobs: bool,
        return_token_ids: bool,
        include_usage: bool,
        stop_token_ids: Collection[int] = (),
    ) -> None:
        self.answers, self.emit, self.prompts, self.n, self.stop = answers, emit, prompts, n, stop
        self.logprobs, self.return_token_ids, self.include_usage = logprobs, return_token_ids, include_usage
        self.stop_token_ids = frozenset(stop_token_ids)
        decode = answers.decode
        if self.stop_token_ids:  # a stop token id ends its completion: its text is no part of the answer's
            decode = lambda ids: answers.decode([t for t in ids if t not in self.stop_token_ids])  # noqa: E731
        self.deltas = [TextDeltas(decode, stop) for _ in range(len(prompts) * n)]
        self.base: dict = {}

    def start(self, weight_step: int) -> None:
        """Before the engine's first step: the chunks' common fields, and any opening chunks."""
        self.base = {
            "id": new_id(self.prefix),
            "object": self.kind,
            "created": int(time.time()),
            "model": self.answers.model_name,
            "weight_step": weight_step,
        }

    def on_tokens(self, new: list[NewTokens]) -> None:
        """ServingOptions.on_tokens: a chunk per choice that gained tokens."""
        chunks = [self.delta_chunk(t, self.deltas[t.index].add(t.token_ids)) for t in new]
        if any(c is not None for c in chunks):
            self.emit(b"".join(sse({**self.base, "choices": [c]}) for c in chunks if c is not None))

    def finish(self, groups: list[list[Completion]]) -> None:
        """After the engine: each choice's rest of text and finish reason, then the usage chunk."""
        chunks = []
        for i, c in enumerate(c for group in groups for c in group):
            text = self.answers.text(c, self.stop, self.stop_token_ids)
            chunk = self.last_chunk(i, self.deltas[i].rest(text), finish_reason(c))
            chunks.append(sse({**self.base, "choices": [chunk]}))
        if self.include_usage:
            chunks.append(sse({**self.base, "choices": [], "usage": usage(self.prompts, groups)}))
        self.emit(b"".join(chunks))

    def delta_chunk(self, new: NewTokens, text: str) -> dict | None:
        """The chunk of a choice's new tokens and text, or None when it would carry nothing."""
        raise NotImplementedError

    def last_chunk(self, index: int, text: str, finish: str) -> dict:
        """The chunk of a choice's rest of text and finish reason."""
        raise NotImplementedError


class ChatStream(AnswerStream):
    """chat.completion.chunk events: `delta.content`, `logprobs.content`."""

    kind, prefix = "chat.completion.chunk", "chatcmpl"

    def start(self, weight_step: int) -> None:
        super().start(weight_step)
        chunks = []
        for i in range(self.n):
            choice = {
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            extra = {"prompt_token_ids": self.prompts[0]} if self.return_token_ids and i == 0 else {}
            chunks.append(sse({**self.base, **extra, "choices": [choice]}))
        self.emit(b"".join(chunks))

    def delta_chunk(self, new: NewTokens, text: str) -> dict | None:
        if not (text or self.logprobs or self.return_token_ids):
            return None
        choice = {"index": new.index, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
        if self.logprobs:
            content = self.answers.chat_logprobs(new.token_ids, new.logprobs, new.top_logprobs)
            choice["logprobs"] = {"content": content}
        if self.return_token_ids:
            choice["token_ids"] = new.token_ids
        return choice

    def last_chunk(self, index: int, text: str, finish: str) -> dict:
        delta = {"content": text} if text else {}
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}


class CompletionStream(AnswerStream):
    """text_completion events: `text`, `logprobs` {tokens, token_logprobs, top_logprobs, text_offset}."""

    kind, prefix = "text_completion", "cmpl"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.offsets = [0] * len(self.deltas)  # text_offset of each choice's next token
        self.started = [False] * len(self.deltas)

    def delta_chunk(self, new: NewTokens, text: str) -> dict | None:
        if not (text or self.logprobs or self.return_token_ids):
            return None
        i = new.index
        choice = {"index": i, "text": text, "logprobs": None, "finish_reason": None}
        if self.logprobs:
            choice["logprobs"] = self.answers.completion_logprobs(
                new.token_ids, new.logprobs, new.top_logprobs, self.offsets[i]
            )
            self.offsets[i] += sum(map(len, choice["logprobs"]["tokens"]))
        if self.return_token_ids:
            choice["token_ids"] = new.token_ids
            if not self.started[i]:
                choice["prompt_token_ids"] = self.prompts[i // self.n]
        self.started[i] = True
        return choice

    def last_chunk(self, index: int, text: str, finish: str) -> dict:
        choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
        if self.return_token_ids and not self.started[index]:  # a choice with no tokens
            choice.update(token_ids=[], prompt_token_ids=self.prompts[index // self.n])
        return choice
