"""Chats rendered as SFT sequences: the token ids of the policy's chat template and a loss mask that is 1
exactly on the assistant tokens a rollout would have sampled (never system, user or tool tokens).

Rendered as rollouts are (grpokit.environments.chat_tokens): a rollout's prompt is
`template(messages, tools, add_generation_prompt=True)` and its completion is what the engine samples,
up to and including the token it stops on (EOS, `<|im_end|>` in ChatML); the rest of the template's
closing (ChatML's "\\n") comes from the environment, with mask 0. So for each assistant message i:

    before_i  = template(messages[:i], add_generation_prompt=True)     (turn i's prompt, as a rollout's)
    through_i = template(messages[:i+1])                                 (the same, with turn i closed)
    full      = template(messages)
    mask      = 1 on full[len(before_i) : len(through_i)], up to and including its first EOS

Both renders must be prefixes of `full` (token by token): a template that renders an earlier turn
differently once later turns follow (one that drops earlier reasoning, say) cannot mark assistant spans
this way, and is refused with its name, as ChatTokens refuses it for multi-turn rollouts.

Tool calls: an assistant message's structured `tool_calls` (OpenAI's format) are left to the template
when it renders them (Qwen's); a template that drops them (SmolLM2's ChatML) gets them written into the
message's content in grpokit's Hermes syntax, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
the text grpokit.environments.tools parses a rollout's calls from.

Images: a chat whose messages hold image parts (grpokit.vision.messages) is rendered as an image prompt
is for a rollout (grpokit.orchestrator.image_prompts): the processor's chat template, then a processor
call that expands each image's placeholder tokens, for `full` and each prefix alike (a prefix is given
the images its messages hold). The sequence keeps the full render's image inputs (Rendered.vision), which
travel with it to the trainer's forward; image tokens are never in the mask. A chat without images keeps
the tokenizer's template, unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from grpokit.environments.chat_tokens import ChatTokens
from grpokit.vision.images import PixelBudget
from grpokit.vision.inputs import VisionInputs
from grpokit.vision.messages import has_images, prompt_images

_PROBE_TOOL = "grpokit_probe_tool"


@dataclass
class Rendered:
    """One SFT sequence: token ids, the loss mask (1 on assistant tokens), whether it was cut, and the image
    inputs of a chat with images (grpokit.vision.inputs; None without)."""

    input_ids: list[int]
    loss_mask: list[int]
    truncated: bool = False
    vision: VisionInputs | None = None

    def cut(self, max_length: int) -> Rendered:
        """The first max_length tokens (not for a chat with images: a cut could split an image's tokens
        from its pixels, so SFTData drops such an example instead)."""
        return Rendered(self.input_ids[:max_length], self.loss_mask[:max_length], True)


class ChatRenderer:
    """Renders chats with one tokenizer's chat template into SFT sequences (see the module docstring)."""

    def __init__(self, tokenizer, pixel_budget: PixelBudget | None = None) -> None:
        ChatTokens(tokenizer)  # refuses a template that does not render a reply as its own tokens
        self.tokenizer, self.name = tokenizer, tokenizer.name_or_path
        self.stop_ids = {tokenizer.eos_token_id}
        self.renders_tool_calls = _renders_tool_calls(self)
        self.pixel_budget, self._processor = pixel_budget, None

    def processor(self, where: str):
        """The policy's processor (loaded on the first chat with images; a text-only model is refused)."""
        if self._processor is None:
            from grpokit.vision.render import check_vision_model, load_processor

            check_vision_model(self.name, where=where)
            self._processor = load_processor(self.name)
        return self._processor

    def ids(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        generation_prompt: bool = False,
        images: list | None = None,
    ) -> list[int]:
        """The template's token ids: the same call as a rollout's prompt (ChatTokens.prompt); with `images`
        (the chat's images, in order), the processor's, as an image prompt's (grpokit.vision.render)."""
        if images is not None:
            return self._image_render(messages, images, generation_prompt)[0]
        return list(
            self.tokenizer.apply_chat_template(
                messages, tools=tools or None, tokenize=True, add_generation_prompt=generation_prompt, return_dict=False
            )
        )

    def render(
        self, messages: list[dict], tools: list[dict] | None = None, where: str = "an example", key: str = "data"
    ) -> Rendered:
        """`messages` as ids and a loss mask over its assistant turns; ValueError (naming `where`, and
        `key`, the recipe section of its field mapping) for a chat without an assistant turn, an empty
        assistant turn, or a template that cannot mark them."""
        messages = [self._message(m, where) for m in messages]
        check_turns(messages, where, key)
        images, vision = None, None
        if has_images(messages):
            if tools:
                raise ValueError(f"{where}: a chat with images and tool schemas is not supported yet (docs/vision.md)")
            self.processor(where)
            messages, images = prompt_images(messages, self.pixel_budget, where)
            full, vision = self._image_render(messages, images, False)
        else:
            full = self.ids(messages, tools)
        mask = [0] * len(full)
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self.ids(messages[:i], tools, True, images)
            through = self.ids(messages[: i + 1], tools, False, images)
            if full[: len(before)] != before or full[: len(through)] != through or len(through) <= len(before):
                raise ValueError(
                    f"{where}: the chat template of {self.name!r} renders assistant turn {i} differently once "
                    "later turns follow, so its tokens cannot be marked as a rollout's would be; use a template "
                    "that keeps earlier turns as they were (ChatML, Llama 3, Qwen 2.5), or set data.tokenizer "
                    "to the policy's tokenizer folder with such a template"
                )
            end = next((t + 1 for t in range(len(before), len(through)) if full[t] in self.stop_ids), len(through))
            mask[len(before) : end] = [1] * (end - len(before))
        return Rendered(full, mask, vision=vision)

    def _image_render(self, messages: list[dict], images: list, generation_prompt: bool):
        """(ids, VisionInputs) of processor-shaped `messages` given the first of `images` they hold."""
        from grpokit.vision.render import render_prompt

        count = sum(1 for m in messages if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image")
        rendered = render_prompt(self._processor, messages, images[:count], generation_prompt)
        return rendered.prompt_ids, rendered.vision

    def _message(self, message: dict, where: str) -> dict:
        """A message as the template takes it: content a string (None -> ""), structured tool calls
        written into the content when the template would drop them."""
        if not isinstance(message, dict) or "role" not in message:
            raise ValueError(f"{where}: every message needs a role and a content, got {message!r}")
        out = {k: v for k, v in message.items() if v is not None}
        out["content"] = message.get("content") or ""
        calls = [_call(c) for c in message.get("tool_calls") or []]
        if calls and not self.renders_tool_calls:
            text = "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in calls)
            if isinstance(out["content"], list):  # content parts (text and images): the calls as a text part
                out["content"] = [*out["content"], {"type": "text", "text": text}]
            else:
                out["content"] = f"{out['content']}\n{text}" if out["content"] else text
            out.pop("tool_calls")
        elif calls:
            out["tool_calls"] = [{"type": "function", "function": c} for c in calls]
        return out


def check_turns(messages: list[dict], where: str, key: str = "data") -> None:
    """A chat to learn from: an assistant turn, none empty, and something before the first one."""
    roles = [m["role"] for m in messages]
    if "assistant" not in roles:
        raise ValueError(
            f"{where}: no assistant turn to train on (roles {roles}); every example needs at least one "
            f"assistant message (check {key}.fields)"
        )
    if roles[0] == "assistant":
        raise ValueError(f"{where}: the chat starts with an assistant turn; it needs a prompt before it")
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and not str(m["content"]).strip() and not m.get("tool_calls"):
            raise ValueError(
                f"{where}: assistant turn {i} is empty (no content, no tool calls): it would teach the model "
                "to end its turn at once; remove the turn or the example from the data"
            )


def _call(call: dict[str, Any]) -> dict[str, Any]:
    """{"name", "arguments" (a dict)} from OpenAI's {"type": "function", "function": {...}} or a plain one."""
    function = call.get("function", call)
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        arguments = json.loads(arguments) if arguments.strip() else {}
    return {"name": function["name"], "arguments": arguments}


def _renders_tool_calls(renderer: ChatRenderer) -> bool:
    """Whether the template writes an assistant message's structured tool calls into the text."""
    call = {"type": "function", "function": {"name": _PROBE_TOOL, "arguments": {}}}
    probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    try:
        return _PROBE_TOOL in renderer.tokenizer.decode(renderer.ids(probe))
    except Exception:  # a template that cannot take tool_calls at all drops them
        return False
