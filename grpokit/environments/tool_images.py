"""Tool results with pictures: a tool's image as message content parts, held to data.pixel_budget, and
shown where the processor's chat template can show it.

A tool may return a picture: a PIL image, or a list (or tuple) holding at least one picture, whose items
are strings (text), PIL images, and the part dicts a prompt holds (`{"type": "text", ...}`,
`{"type": "image_url", "image_url": {"url": ...}}`, `{"type": "image", "image": ...}`: grpokit.vision
.messages). The result becomes the tool message's content as parts (`picture_parts`): every image a
`image_url` part, a PIL image or bytes as a PNG `data:` URL, so the chat stays JSON (samples.jsonl) and
verifiers' ToolMessage takes it (it refuses PIL images in parts); the text parts are cut at the tools'
MAX_RESULT_CHARS together. Any other value is text, as before (grpokit.environments.tools).

The tool turn is rendered as a `respond` turn with images is (grpokit.environments.image_turns): the
processor renders the new messages after the probe chat, the pictures' placeholders expanded, and the
conversation's image inputs grow by the turn's, so every later turn is sampled and scored with them.

A picture that cannot be used (unreadable, over data.pixel_budget with `over_budget: refuse`, or bringing
the conversation past `max_images`) is the tool's error, as every other tool failure is (`checked_pictures`):
the model reads "Error: ...", it counts in env/tool_errors, and a WARNING names the environment, example
and tool (once per tool, and the reason). A `respond` with such a picture stops the run instead: its author's
turn cannot be replaced by an error message, while a tool's answer to the model's call can. A text-only
policy, and an engine that cannot sample later-turn images, stop the run at that turn naming the environment
and example: the run's settings are wrong, not the tool.

Where the processor's chat template cannot show a picture in a `tool` message (`shows_tool_pictures`: its
image placeholder is not rendered for that role, or the template raises on it), each tool message's
pictures go in a `user` message right after its text (`pictures_after_tools`): a user turn is where every
vision-language template shows pictures. The conversation's messages (what rewards and `respond` see) keep
the tool's own form. Both tiny test families' templates (ChatML, images in any role), and
Qwen2.5-VL's and SmolVLM's released ones, render pictures in tool messages, so there the picture stays in
the tool message.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from PIL import Image

from grpokit.common.once import Once
from grpokit.environments.chat_tokens import PROBE_CHAT
from grpokit.vision.images import ImageError, PixelBudget, load_image, to_data_url
from grpokit.vision.messages import check_image_count, is_image_part, prompt_images

log = logging.getLogger(__name__)
_WARNED = Once()  # tools whose unusable pictures were warned of, this process
TOOL_PICTURE = "a tool returned a picture"
RESPOND_PICTURE = "respond() returned a message with images"


def picture_parts(value: Any, max_chars: int) -> list[dict[str, Any]] | None:
    """A tool's result as content parts when it holds a picture (see the module docstring), else None (the
    result is text). A part that is neither text nor an image raises ValueError naming it."""
    if isinstance(value, Image.Image):
        items = [value]
    elif isinstance(value, (list, tuple)) and any(_is_picture(item) for item in value):
        items = list(value)
    else:
        return None
    parts, room = [], max_chars
    for item in items:
        part = _part(item)
        if part["type"] == "text":
            part = {"type": "text", "text": part["text"][: max(room, 0)]}
            room -= len(part["text"])
        parts.append(part)
    return parts


def portable_parts(content: Any, label: str | None = None) -> Any:
    """A message content with each image part whose image is a PIL image or bytes as a PNG `data:` URL
    `image_url` part (JSON, and what verifiers' messages take); a str, and other parts, unchanged (an
    unreadable image is an ImageError naming `label`)."""
    if not isinstance(content, list):
        return content
    return [_url_part(to_data_url(load_image(p["image"], label=label))) if _holds_pixels(p) else p for p in content]


def _holds_pixels(part: Any) -> bool:
    """An image part whose image is pixels in memory (a PIL image, bytes), not a path or a URL."""
    pixels = part.get("image") if isinstance(part, dict) and part.get("type") == "image" else None
    return isinstance(pixels, (Image.Image, bytes))


def _is_picture(item: Any) -> bool:
    return isinstance(item, Image.Image) or (isinstance(_as_dict(item), dict) and is_image_part(_as_dict(item)))


def _as_dict(item: Any) -> Any:
    """A verifiers/pydantic content part as its dict; anything else as it is."""
    return item.model_dump(exclude_none=True) if callable(getattr(item, "model_dump", None)) else item


def _part(item: Any) -> dict[str, Any]:
    """One item of a tool's result as a content part: a str as text, an image as an `image_url` part."""
    item = _as_dict(item)
    if isinstance(item, str):
        return {"type": "text", "text": item}
    if isinstance(item, Image.Image):
        return _url_part(to_data_url(item.convert("RGB")))
    if isinstance(item, dict) and item.get("type") == "text":
        return {"type": "text", "text": str(item.get("text") or "")}
    if isinstance(item, dict) and item.get("type") == "image_url":
        return item
    if isinstance(item, dict) and item.get("type") == "image":
        image = next((item[k] for k in ("image", "url", "path") if item.get(k) is not None), None)
        if isinstance(image, str):
            return _url_part(image)
        if isinstance(image, (Image.Image, bytes)):
            return _url_part(to_data_url(load_image(image)))  # decoded: bytes must be a picture's
        raise ValueError(f"an image part without an image (a PIL image, bytes, a path or a data: URL): {item!r:.80}")
    kind = item.get("type") if isinstance(item, dict) else type(item).__name__
    raise ValueError(f"a part of type {kind!r} beside its picture (text and images are supported)")


def _url_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def checked_pictures(results: list, budget: PixelBudget | None, held: int, where: str) -> list:
    """The tool results (grpokit.environments.tools.ToolResult), each picture result whose images cannot be
    used within `budget` (data.pixel_budget; `held`: the images the conversation holds already) replaced by
    the tool's error, which the model reads; the pictures that can be used count toward max_images."""
    budget = budget or PixelBudget()
    out = []
    for result in results:
        if not isinstance(result.content, list):
            out.append(result)
            continue
        try:
            _, images = prompt_images([{"role": "tool", "content": result.content}], budget, where)
            check_image_count(held + len(images), budget, what="the conversation would hold ")
        except ImageError as e:
            reason = str(e).removeprefix(f"{where}: ")
            _warn_unusable(result.call.name, reason, where)
            message = f"Error: the tool {result.call.name!r} returned a picture that cannot be used: {reason}"
            out.append(replace(result, content=message, status="error"))
            continue
        held += len(images)
        out.append(result)
    return out


def _warn_unusable(name: str, reason: str, where: str) -> None:
    """Log, once per tool, that a picture it returned could not be used (counted in env/tool_errors)."""
    if _WARNED.first(name):
        log.warning(
            "%s: the tool %r returned a picture that cannot be used (%s); the model gets the tool's error instead "
            "(counted in env/tool_errors; warned once per tool); return smaller pictures, fewer of them, or raise "
            "data.pixel_budget",
            where,
            name,
            reason,
        )


def shows_tool_pictures(processor) -> bool:
    """Whether the processor's chat template renders a picture inside a `tool` message: one image
    placeholder more than the same message without it (a template that drops it, or raises on it, does not)."""

    def render(content: list[dict[str, Any]]) -> str:
        chat = [*PROBE_CHAT, {"role": "tool", "content": content}]
        return processor.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)

    try:
        shown = render([{"type": "text", "text": "x"}, {"type": "image"}])
        bare = render([{"type": "text", "text": "x"}])
    except Exception:  # a template that refuses an image part in this role (raise_exception, a type error)
        return False
    token = getattr(processor, "image_token", None)
    return shown.count(token) == bare.count(token) + 1 if token else shown != bare


def pictures_after_tools(shaped: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Processor-shaped messages with each `tool` message's pictures moved into a `user` message right after
    its text (the images keep their order), for templates that cannot show a picture in a tool message."""
    out = []
    for message in shaped:
        content = message.get("content")
        pictures = [p for p in content if p.get("type") == "image"] if isinstance(content, list) else []
        if message.get("role") != "tool" or not pictures:
            out.append(message)
            continue
        text = "".join(p.get("text", "") for p in content if p.get("type") == "text")
        out += [{**message, "content": text}, {"role": "user", "content": pictures}]
    return out


def image_turn_source(messages: list[dict[str, Any]]) -> str:
    """What brought the conversation's latest later-turn images, for errors: a tool or `respond`."""
    for message in reversed(messages):
        content = message.get("content")
        if isinstance(content, list) and any(isinstance(p, dict) and is_image_part(p) for p in content):
            return TOOL_PICTURE if message.get("role") == "tool" else RESPOND_PICTURE
    return RESPOND_PICTURE
