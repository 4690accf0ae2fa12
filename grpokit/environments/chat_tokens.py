"""Token ids of the environment's turns, rendered without re-tokenising the conversation so far.

A multi-turn rollout is one token sequence: prompt, completion 1, environment tokens, completion 2, ...
The trainer must see exactly the tokens the engine saw and produced. Re-rendering the whole chat after
each turn (decode the completion to text, apply the chat template, tokenise again) can give other ids
for the same text (BPE merges across the boundary, templates that rewrite earlier assistant turns, e.g.
strip their reasoning), so the trainer would score tokens the engine never sampled: silent off-policy
drift. Here only the environment's new messages are rendered, as a suffix:

    probe  = template([user "x", assistant "y"])                     (ends with the assistant closing)
    full   = template([user "x", assistant "y"] + new_messages, add_generation_prompt=True)
    suffix = full[len(probe):]              (the new messages and the next assistant header)

and the assistant closing (e.g. `<|im_end|>` `\\n` in ChatML) is completed after the engine's tokens: the
part the completion already holds (it stopped on `<|im_end|>`) is not repeated. `full` must start with
`probe` (the template renders a conversation's beginning the same whatever follows); a template that
does not is refused with its name, rather than trained on with drifting ids.
"""

from __future__ import annotations

import functools
from typing import Any

_PROBE_USER = {"role": "user", "content": "x"}
_PROBE_REPLY = "y"
PROBE_CHAT = (_PROBE_USER, {"role": "assistant", "content": _PROBE_REPLY})  # the chat `probe` renders


class ChatTokens:
    """Renders the environment's messages between two assistant turns as token ids, for one tokenizer
    (and the tool schemas its template lists in the prompt, when it has tool support)."""

    def __init__(self, tokenizer, tools: list[dict[str, Any]] | None = None) -> None:
        self.tokenizer, self.tools = tokenizer, tools or None
        header = self._render([_PROBE_USER], add_generation_prompt=True)
        self.probe = self._render([_PROBE_USER, {"role": "assistant", "content": _PROBE_REPLY}])
        content = tokenizer.encode(_PROBE_REPLY, add_special_tokens=False)
        start = _find(self.probe, content, len(header))
        if self.probe[: len(header)] != header or start < 0:
            raise ValueError(
                f"the chat template of {tokenizer.name_or_path!r} does not render an assistant reply after "
                "its generation prompt as the reply's own tokens; multi-turn rollouts need a template that "
                "does (ChatML, Llama 3, Qwen)"
            )
        self.closing = self.probe[start + len(content) :]  # what ends an assistant turn: <|im_end|> \n

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> list[int]:
        return list(
            self.tokenizer.apply_chat_template(
                messages,
                tools=self.tools,
                tokenize=True,
                add_generation_prompt=add_generation_prompt,
                return_dict=False,
            )
        )

    def prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        """The first prompt's ids: the chat and the assistant header, with the tool schemas."""
        return self._render(messages, add_generation_prompt=True)

    def after_completion(self, completion_ids: list[int], messages: list[dict[str, Any]]) -> list[int]:
        """The ids that follow a finished completion: the rest of the assistant turn's closing, the
        environment's `messages` (tool results, a user's or a game's reply), the next assistant header."""
        full = self._render(
            [_PROBE_USER, {"role": "assistant", "content": _PROBE_REPLY}, *messages], add_generation_prompt=True
        )
        if full[: len(self.probe)] != self.probe:
            raise ValueError(
                f"the chat template of {self.tokenizer.name_or_path!r} renders an assistant turn differently "
                f"once {[m['role'] for m in messages]} messages follow it; its ids cannot be extended turn "
                "by turn without re-tokenising (use a template that keeps earlier turns as they were)"
            )
        return self.closing[_held(completion_ids, self.closing) :] + full[len(self.probe) :]

    @functools.cached_property
    def token_chars(self) -> int:
        """Characters in the tokenizer's longest vocabulary entry (added tokens included): no token holds
        more of a message's text."""
        return max(map(len, self.tokenizer.get_vocab()), default=1)

    def cannot_fit(self, messages: list[dict[str, Any]], room: int) -> bool:
        """Whether `messages` certainly render to more than `room` tokens, told from their characters
        alone (their text needs at least len / token_chars tokens), so that a turn too long for the budget
        is refused before the chat template and the tokenizer read all of it."""
        return text_chars(messages) > max(room, 0) * self.token_chars

    def closing_after(self, completion_ids: list[int]) -> list[int]:
        """The rest of the assistant closing after a completion (the last turn's, before scoring)."""
        return self.closing[_held(completion_ids, self.closing) :]


def text_chars(messages: list[dict[str, Any]]) -> int:
    """The characters of the messages' text: a str content, or a list of parts' text parts (an image's
    tokens are counted once rendered)."""
    total = 0
    for m in messages:
        content = m.get("content") or ""
        parts = content if isinstance(content, list) else [{"text": content}]
        total += sum(len(p.get("text") or "") for p in parts if isinstance(p, dict))
    return total


def _find(seq: list[int], sub: list[int], start: int) -> int:
    """The index of the first occurrence of `sub` in `seq` at or after `start`, or -1."""
    for i in range(start, len(seq) - len(sub) + 1):
        if seq[i : i + len(sub)] == sub:
            return i
    return -1


def _held(completion_ids: list[int], closing: list[int]) -> int:
    """How many of the closing's first tokens end the completion (it stopped on the end-of-turn token)."""
    for k in range(min(len(closing), len(completion_ids)), 0, -1):
        if completion_ids[-k:] == closing[:k]:
            return k
    return 0
