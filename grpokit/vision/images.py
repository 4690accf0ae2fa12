"""Images from task data -> RGB PIL images within a pixel budget.

An environment's prompt names an image as a file path, raw bytes, a PIL image or a `data:` URL (the
forms a verifiers/OpenAI content part carries). Each is decoded here, once, to an RGB PIL image: the
processors of every model family take that, and a palette or RGBA image would otherwise be converted
differently by each. A recipe's pixel budget (`max_pixels`) bounds the vision tower's cost: an image
over it is resized to fit (aspect ratio kept) or refused, per `over_budget`. Every failure is an
ImageError (a ValueError) that names the image and, where given, the example it belongs to, so a run
can log and skip that example instead of crashing mid-step.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from PIL import Image, UnidentifiedImageError

ImageSource = str | Path | bytes | Image.Image


class ImageError(ValueError):
    """An image that cannot be used: missing, unreadable, or over the pixel budget.

    `label` names the example (environment and example id, as the caller words it); None when unknown.
    """

    def __init__(self, message: str, label: str | None = None) -> None:
        super().__init__(f"{label}: {message}" if label else message)
        self.label = label


@dataclass(frozen=True)
class PixelBudget:
    """How many pixels an image may have, what happens to one with more, and how many images a prompt may
    hold.

    Args:
        max_pixels: width x height limit; None = no limit.
        over_budget: "resize" scales the image down to fit, keeping its aspect ratio; "refuse" raises
            ImageError naming the image's size and the budget.
        max_images: the most images one prompt (or SFT chat) may hold, as the model takes them (e.g. 1 for a
            model trained on single-image prompts, vLLM's limit_mm_per_prompt); a prompt with more is
            refused with ImageError naming the count (a logged skip in a run). None = no limit.
    """

    max_pixels: int | None = None
    over_budget: Literal["resize", "refuse"] = "resize"
    max_images: int | None = None

    def __post_init__(self) -> None:
        if self.max_pixels is not None and self.max_pixels < 1:
            raise ValueError(f"max_pixels must be >= 1 or None, got {self.max_pixels}")
        if self.max_images is not None and self.max_images < 1:
            raise ValueError(f"max_images must be >= 1 or None, got {self.max_images}")
        if self.over_budget not in ("resize", "refuse"):
            raise ValueError(f"over_budget must be 'resize' or 'refuse', got {self.over_budget!r}")


def load_image(source: ImageSource, budget: PixelBudget | None = None, label: str | None = None) -> Image.Image:
    """`source` decoded to an RGB image within `budget` (None: no limit; the forms: module docstring)."""
    image = _decode(source, label)
    try:
        image.load()  # PIL opens lazily: a truncated file fails here, not inside the processor
        image = image.convert("RGB")
    except OSError as e:
        raise ImageError(f"image {_describe(source)} is unreadable: {e}", label) from e
    return fit_to_budget(image, budget or PixelBudget(), label)


def fit_to_budget(image: Image.Image, budget: PixelBudget, label: str | None = None) -> Image.Image:
    """`image` unchanged when within `budget`; else resized to fit (aspect ratio kept) or refused."""
    width, height = image.size
    if budget.max_pixels is None or width * height <= budget.max_pixels:
        return image
    if budget.over_budget == "refuse":
        raise ImageError(
            f"image of {width}x{height} = {width * height} pixels is over the budget of {budget.max_pixels} "
            "pixels (over_budget: refuse)",
            label,
        )
    scale = math.sqrt(budget.max_pixels / (width * height))
    new_w, new_h = max(1, math.floor(width * scale)), max(1, math.floor(height * scale))
    while new_w * new_h > budget.max_pixels:  # floor rounding can still leave one row too many
        new_w, new_h = (new_w - 1, new_h) if new_w >= new_h else (new_w, new_h - 1)
    return image.resize((new_w, new_h), Image.Resampling.BICUBIC)


def _decode(source: ImageSource, label: str | None) -> Image.Image:
    """The PIL image `source` names, not yet loaded."""
    if isinstance(source, Image.Image):
        return source
    if isinstance(source, bytes | bytearray):
        return _open(io.BytesIO(source), f"<{len(source)} bytes>", label)
    if isinstance(source, str) and source.startswith("data:"):
        return _open(io.BytesIO(_data_url_bytes(source, label)), _describe(source), label)
    if isinstance(source, str) and source.startswith(("http://", "https://")):
        raise ImageError(f"image URL {source!r} is not fetched: save the image to a file and name its path", label)
    if isinstance(source, str | Path):
        path = Path(source).expanduser()
        if not path.is_file():
            raise ImageError(f"image file {str(path)!r} does not exist", label)
        return _open(path, repr(str(path)), label)
    raise ImageError(f"an image must be a path, bytes, a PIL image or a data: URL, got {type(source).__name__}", label)


def _open(file, name: str, label: str | None) -> Image.Image:
    try:
        return Image.open(file)
    except (UnidentifiedImageError, OSError) as e:
        raise ImageError(f"image {name} is unreadable: {e}", label) from e


def _data_url_bytes(url: str, label: str | None) -> bytes:
    """The bytes of a `data:[<mime>][;base64],<payload>` URL (only base64 payloads carry images)."""
    head, sep, payload = url.partition(",")
    if not sep or not head.endswith(";base64"):
        raise ImageError(f"data URL {_describe(url)} is not base64 (expected data:image/...;base64,...)", label)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageError(f"data URL {_describe(url)} has a bad base64 payload: {e}", label) from e


def _describe(source: ImageSource) -> str:
    """A short name for `source` in an error (a data URL's payload cut)."""
    if isinstance(source, str) and source.startswith("data:"):
        return repr(source[:40] + "...") if len(source) > 40 else repr(source)
    if isinstance(source, bytes | bytearray):
        return f"<{len(source)} bytes>"
    return repr(str(source))


def to_data_url(image: Image.Image, format: str = "PNG") -> str:
    """`image` as a base64 `data:` URL (lossless PNG by default): how an image travels in a JSON message."""
    buffer = io.BytesIO()
    image.save(buffer, format=format)
    return f"data:image/{format.lower()};base64,{base64.b64encode(buffer.getvalue()).decode()}"
