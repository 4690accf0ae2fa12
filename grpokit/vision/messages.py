"""Chat messages with image content parts -> the processor's message shape + the ordered images.

A verifiers/OpenAI message's `content` is a string or a list of parts. Image parts come as
`{"type": "image_url", "image_url": {"url": ...}}` (OpenAI; the url a path or a data: URL; vLLM's token-in
route's `content_parts` flatten it to `{"type": "image_url", "url": ...}`, also read) or
`{"type": "image", "image": ...}` (verifiers and Hugging Face; a path, bytes, a PIL image or a data:
URL; `url` or `path` instead of `image` also read). Any message, any turn, may hold several.
Processors' chat templates want a bare `{"type": "image"}` where each image goes and the images
themselves, in the same order, passed to the processor call: that is what `split_images` returns.
"""

from __future__ import annotations

from grpokit.vision.images import ImageError, ImageSource, PixelBudget, load_image

Message = dict  # {"role": str, "content": str | list[dict]}


def is_image_part(part: dict) -> bool:
    return part.get("type") in ("image", "image_url")


def has_images(messages: list[Message]) -> bool:
    """Whether any message's content holds an image part."""
    return any(
        isinstance(m.get("content"), list) and any(isinstance(p, dict) and is_image_part(p) for p in m["content"])
        for m in messages
    )


def image_source(part: dict, label: str | None = None) -> ImageSource:
    """Where an image part's image is (a path, bytes, a PIL image or a data: URL)."""
    if part.get("type") == "image_url":
        ref = part.get("image_url", part.get("url"))  # OpenAI's nesting, or vLLM's flat content part
        url = ref.get("url") if isinstance(ref, dict) else ref
        if not url:
            raise ImageError(f"image_url part without a url: {_short(part)}", label)
        return url
    for key in ("image", "url", "path"):
        if part.get(key) is not None:
            return part[key]
    raise ImageError(f"image part without an image (expected an image, url or path key): {_short(part)}", label)


def split_images(messages: list[Message], label: str | None = None) -> tuple[list[Message], list[ImageSource]]:
    """(the messages with each image part replaced by `{"type": "image"}`, the image sources in order).

    Text parts keep their text; string contents stay strings; the input is not changed. A part of any
    other type (audio, file) is refused with ImageError: the processor would drop it silently.
    """
    out, sources = [], []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            out.append(dict(message))
            continue
        parts = []
        for part in content:
            if is_image_part(part):
                sources.append(image_source(part, label))
                parts.append({"type": "image"})
            elif part.get("type") == "text":
                parts.append({"type": "text", "text": part.get("text", "")})
            else:
                raise ImageError(
                    f"content part of type {part.get('type')!r} is not supported (text and images are)", label
                )
        out.append({**message, "content": parts})
    return out, sources


def prompt_images(messages: list[Message], budget: PixelBudget | None = None, label: str | None = None):
    """(the processor-shaped messages, the RGB images within `budget` in prompt order): split_images,
    then each source loaded (grpokit.vision.images.load_image; no budget = no limit). More images than
    `budget.max_images` is an ImageError naming the count."""
    shaped, sources = split_images(messages, label)
    check_image_count(len(sources), budget, label)
    return shaped, [load_image(source, budget, label) for source in sources]


def check_image_count(count: int, budget: PixelBudget | None, label: str | None = None, what: str = "") -> None:
    """An ImageError naming the count when `count` images (a prompt's, or a conversation's once a later turn's
    are added: `what` says which) are more than `budget.max_images`; nothing without a limit."""
    limit = budget.max_images if budget is not None else None
    if limit is not None and count > limit:
        message = f"{what}{count} images, more than the model takes (data.pixel_budget.max_images {limit})"
        raise ImageError(message, label)


def _short(part: dict) -> str:
    text = repr(part)
    return text if len(text) <= 80 else text[:77] + "..."
