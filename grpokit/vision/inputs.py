"""A prompt's image inputs to the model, as named plain tensors that travel without pickle.

A vision-language model's forward takes, beside the token ids, tensors its processor made from the
images: Qwen2-VL/Qwen2.5-VL `pixel_values` [patches, C*T*P*P] and `image_grid_thw` [images, 3];
Idefics3/SmolVLM `pixel_values` [1, tiles, C, H, W] and `pixel_attention_mask` [1, tiles, H, W];
LLaVA `pixel_values` [images, C, H, W]. VisionInputs holds them by name with, per name, the dimension
along which the images of several sequences are concatenated when they are packed into one row
(`image_dims`; 0 for the flat layouts, 1 for the nested [batch, tiles, ...] one). grpokit batches are
safetensors files: `to_tensors` gives tensors plus a header of strings (safetensors metadata), and
`from_tensors` reads them back; there is nothing else to serialise. Over HTTP (RemoteEngine to
`grpokit infer`) the same safetensors bytes travel base64-encoded in a JSON field (`to_base64`,
`from_base64`): still no pickle, and the server gets bit for bit the tensors the trainer scores.
vLLM takes no such tensors: it runs its own processor on the pictures. So a rendered prompt's
VisionInputs also keeps, in this process only, its `source` (ImageSource: the pictures and the ids before
the processor expanded their placeholders) for grpokit.inference.vllm.images, which sends those and
checks that vLLM's expansion gives exactly the prompt ids grpokit samples and trains on. A conversation
whose later turn brings pictures grows its source with them (`with_turn`, `grown_source`): all its
pictures, and its ids so far before expansion.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

import torch

FORMAT = "grpokit.VisionInputs"
VERSION = 1


@dataclass
class ImageSource:
    """What a server that renders pictures itself (vLLM) needs to make a prompt's image inputs again: a first
    prompt's, a later turn's (grpokit.vision.render.render_continuation), or a conversation's so far
    (`grown_source`: its first prompt, replies and environment turns, every picture of them).

    Args:
        images: the pictures the processor was given, in prompt order (PIL images, within the pixel budget).
        template_ids: the prompt's ids before the processor expanded each image's placeholder (the chat
            template's text tokenized as it is).
        prompt_ids: the expanded ids (what the engine samples from and the trainer scores).
    """

    images: list[Any]
    template_ids: list[int]
    prompt_ids: list[int]


@dataclass
class VisionInputs:
    """Named image tensors for one sequence or one packed row (no images: both dicts empty).

    Args:
        tensors: model keyword -> tensor, as the processor made it (e.g. pixel_values, image_grid_thw).
        image_dims: model keyword -> the dimension that counts images (or tiles, or patches), along
            which `concat` joins several sequences' tensors.
        source: the pictures and unexpanded ids they were made from (a rendered prompt's, in the
            orchestrator's process; never serialised: None after to_tensors/from_tensors).
        prompt_part: a conversation whose later turns added images (`with_turn`): its first prompt's own
            inputs (empty when it had none), for what pairs the prompt alone with an answer (Chord's
            experts); None otherwise. In the orchestrator's process only, as `source`.
    """

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    image_dims: dict[str, int] = field(default_factory=dict)
    source: ImageSource | None = field(default=None, compare=False, repr=False)
    prompt_part: VisionInputs | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if set(self.tensors) != set(self.image_dims):
            raise ValueError(f"image_dims names {sorted(self.image_dims)}, tensors {sorted(self.tensors)}")

    def __bool__(self) -> bool:
        return bool(self.tensors)

    def model_kwargs(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> dict:
        """The tensors as forward keyword arguments, on `device`; floating ones cast to `dtype` if given."""
        out = {}
        for name, tensor in self.tensors.items():
            cast = dtype if dtype is not None and tensor.is_floating_point() else None
            out[name] = tensor.to(device=device, dtype=cast)
        return out

    def to_tensors(self, prefix: str = "vision.") -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """(tensors named `prefix + keyword`, a header of strings): safetensors' tensors and metadata."""
        tensors = {prefix + name: tensor.contiguous() for name, tensor in self.tensors.items()}
        header = {"format": FORMAT, "version": str(VERSION), "image_dims": json.dumps(self.image_dims, sort_keys=True)}
        return tensors, header

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], header: dict[str, str], prefix: str = "vision."):
        """The VisionInputs `to_tensors` wrote (other tensors in `tensors`, without `prefix`, are ignored)."""
        if header.get("format") != FORMAT or header.get("version") != str(VERSION):
            raise ValueError(
                f"not a {FORMAT} header of version {VERSION}: format {header.get('format')!r}, "
                f"version {header.get('version')!r}"
            )
        image_dims = {name: int(dim) for name, dim in json.loads(header["image_dims"]).items()}
        missing = [prefix + name for name in image_dims if prefix + name not in tensors]
        if missing:
            raise ValueError(f"the header names tensors that are not there: {missing}")
        return cls({name: tensors[prefix + name] for name in image_dims}, image_dims)


def concat(parts: list[VisionInputs]) -> VisionInputs:
    """The image inputs of a packed row: each sequence's tensors joined along their image dimension, in
    the row's order (a model fills its image placeholder tokens with image features in that order).
    Sequences without images add nothing; every sequence with images must have the same keywords."""
    present = [p for p in parts if p]
    if not present:
        return VisionInputs()
    dims = present[0].image_dims
    for part in present[1:]:
        if part.image_dims != dims:
            raise ValueError(f"cannot pack image inputs {part.image_dims} with {dims}: different model inputs")
    tensors = {name: torch.cat([p.tensors[name] for p in present], dim=dim) for name, dim in dims.items()}
    return VisionInputs(tensors, dict(dims))


def with_turn(vision: VisionInputs | None, turn: VisionInputs, before: list[int] | None = None) -> VisionInputs:
    """A conversation's image inputs once a later turn added `turn`'s images: `vision`'s, then `turn`'s
    (the order of their placeholders in the sequence, which the model fills in order); `prompt_part`
    keeps the first prompt's. `before`: the conversation's ids before the turn (expanded); with it and
    the turn's ImageSource, the conversation's ImageSource grows too (`grown_source`)."""
    joined = concat([vision or VisionInputs(), turn])
    joined.prompt_part = prompt_inputs(vision) or VisionInputs()
    if before is not None and turn.source is not None:
        joined.source = grown_source(vision, before, turn.source)
    return joined


def grown_source(vision: VisionInputs | None, before: list[int], turn: ImageSource) -> ImageSource | None:
    """The ImageSource of a conversation whose ids so far are `before` (expanded: the first prompt, the
    replies, the environment's turns) once a later turn with `turn`'s pictures follows: every picture so
    far, in order, and the whole conversation's ids before expansion, so that vLLM, given them, expands
    them into `before` + the turn's ids. The ids after the last turn with pictures (replies, text turns)
    hold no placeholder, so they are the same either way. None when `vision` holds images without their
    source (read back from a batch file): nothing can say how its ids looked before expansion."""
    source = vision.source if vision is not None else None
    if source is None and vision:
        return None
    done = source.prompt_ids if source is not None else []
    if before[: len(done)] != done:
        raise ValueError("a conversation's ids do not begin with the ids its earlier pictures were rendered into")
    template = (source.template_ids if source is not None else []) + before[len(done) :] + turn.template_ids
    images = (source.images if source is not None else []) + turn.images
    return ImageSource(images, template, before + turn.prompt_ids)


def prompt_inputs(vision: VisionInputs | None) -> VisionInputs | None:
    """The first prompt's image inputs of a sequence's `vision` (None: it had none): `vision` itself,
    unless a conversation's later turns added images to it (`with_turn`)."""
    if vision is None:
        return None
    part = vision.prompt_part if vision.prompt_part is not None else vision
    return part or None


def to_base64(vision: VisionInputs) -> str:
    """`vision` as base64 safetensors bytes, its header as their metadata (how it travels in JSON)."""
    from safetensors.torch import save

    tensors, header = vision.to_tensors()
    return base64.b64encode(save(tensors, metadata=header)).decode("ascii")


def from_base64(text: str) -> VisionInputs:
    """The VisionInputs `to_base64` wrote; ValueError for anything else (not base64, not safetensors, no
    VisionInputs header). safetensors reads only tensors: nothing in the bytes is run."""
    from safetensors.torch import load

    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"not base64: {e}") from None
    size = int.from_bytes(raw[:8], "little") if len(raw) >= 8 else -1
    if not 0 < size <= len(raw) - 8:
        raise ValueError("not safetensors bytes (no header)")
    try:
        header = json.loads(raw[8 : 8 + size]).get("__metadata__") or {}
        tensors = load(raw)
    except Exception as e:  # safetensors' own error type, JSON errors, a header that is not an object
        raise ValueError(f"not safetensors bytes: {type(e).__name__}: {e}") from None
    if not isinstance(header, dict):
        raise ValueError("the safetensors metadata is not an object")
    try:
        return VisionInputs.from_tensors(tensors, header)
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
        raise ValueError(f"bad VisionInputs header: {type(e).__name__}: {e}") from None
