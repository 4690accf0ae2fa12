"""A chat prompt with images -> prompt token ids + the model's image inputs, with the model's processor.

The processor (AutoProcessor) is the only thing that knows how many placeholder tokens an image
becomes (Qwen2-VL: grid t*h*w / merge_size^2; Idefics3: image_seq_len per tile, tiles per image
from its size) and what tensors the model reads. So rendering is: the chat template as text
(`processor.apply_chat_template`, images as `{"type": "image"}` parts), then one processor call on
that text and the images, which expands each image's placeholder and makes the tensors. The ids are
what the engine is given and the trainer scores; the tensors become a VisionInputs.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from grpokit.vision.inputs import ImageSource, VisionInputs

# Per-token outputs of a processor call, not image inputs: the ids carry them (grpokit.vision.positions
# derives mm_token_type_ids from the ids, since a packed row's must be the concatenation of its sequences').
TOKEN_KEYS = frozenset({"input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids"})


@dataclass
class RenderedPrompt:
    """A prompt as the model takes it: token ids (image placeholders expanded) and its image inputs."""

    prompt_ids: list[int]
    vision: VisionInputs


def render_prompt(
    processor,
    messages: list[dict],
    images: list[Image.Image],
    add_generation_prompt: bool = True,
    keep_source: bool = False,
) -> RenderedPrompt:
    """Render `messages` (processor-shaped: grpokit.vision.messages.split_images) with `images`, in order,
    ending with the assistant header (add_generation_prompt; without it, a whole chat for SFT).
    `keep_source`: the VisionInputs keeps the pictures and the ids before expansion (ImageSource), for an
    engine that renders the pictures itself (vLLM)."""
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    encoded = processor(text=[text], images=images or None, add_special_tokens=False, return_tensors="pt")
    ids = encoded["input_ids"][0].tolist()
    tensors = {name: value for name, value in encoded.items() if name not in TOKEN_KEYS}
    vision = VisionInputs(tensors, image_dims(tensors))
    if keep_source:
        template_ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
        vision.source = ImageSource(list(images), list(template_ids), ids)
    return RenderedPrompt(ids, vision)


def render_continuation(
    processor, prefix: list[dict], messages: list[dict], images: list[Image.Image], keep_source: bool = False
) -> RenderedPrompt:
    """The ids that `messages` (processor-shaped, holding `images` in order) add after the chat `prefix`,
    ending with the assistant header, and the image inputs of those images alone: a later turn of a
    conversation. The whole chat is one processor call (each image's placeholders expanded), less the
    prefix's own ids, which must begin it (a template that renders the prefix otherwise is refused).
    `keep_source`: the VisionInputs keeps the turn's pictures and its ids before expansion (ImageSource:
    the chat's text tokenized as it is, less the prefix's), which a conversation's ImageSource grows by
    (grpokit.vision.inputs.with_turn) for an engine that renders the pictures itself (vLLM)."""
    head = processor.apply_chat_template(prefix, tokenize=False)
    text = processor.apply_chat_template([*prefix, *messages], tokenize=False, add_generation_prompt=True)
    head_ids = list(processor(text=[head], add_special_tokens=False)["input_ids"][0])
    encoded = processor(text=[text], images=images or None, add_special_tokens=False, return_tensors="pt")
    ids = encoded["input_ids"][0].tolist()
    template_ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"] if keep_source else head_ids
    if ids[: len(head_ids)] != head_ids or list(template_ids[: len(head_ids)]) != head_ids:
        raise ValueError(
            "the processor's chat template renders a conversation's beginning differently once messages with "
            "images follow it; its ids cannot be extended turn by turn (use a template that keeps earlier turns)"
        )
    tensors = {name: value for name, value in encoded.items() if name not in TOKEN_KEYS}
    vision = VisionInputs(tensors, image_dims(tensors))
    if keep_source:
        vision.source = ImageSource(list(images), list(template_ids[len(head_ids) :]), ids[len(head_ids) :])
    return RenderedPrompt(ids[len(head_ids) :], vision)


def expand_image_ids(
    processor, template_ids: list[int], images: list[Image.Image]
) -> tuple[RenderedPrompt, list[tuple[int, int]]]:
    """Token ids before expansion (one image placeholder token per image, as vLLM's token-in route takes
    them) and their `images`, in order -> the prompt as the model takes it, and each image's placeholder
    range (offset, length) in its ids: the span that replaced that image's placeholder token.

    The expansion is done on the ids, not on their text: each placeholder token is replaced by the ids the
    processor makes of that image's placeholder alone, and every other id is kept as given (so a client's
    own tokenization stays; vLLM expands token prompts the same way). For the chat template's text
    tokenized as it is, these are the ids `render_prompt` makes of the chat (tests/vision/
    test_generate_images.py checks both tiny families). The tensors come from one processor call on all
    the images, as in `render_prompt`. A ValueError when the placeholders are not one per image, or when
    the processor expands an image differently beside others (the ranges could not be told apart)."""
    token = getattr(processor, "image_token", None)
    if token is None:
        raise ValueError(f"{type(processor).__name__} names no image token, so token ids cannot place images")
    token, token_id = str(token), processor.tokenizer.convert_tokens_to_ids(str(token))
    count = template_ids.count(token_id)
    if count != len(images):
        raise ValueError(
            f"the token ids hold {count} image placeholders ({token}, id {token_id}) for {len(images)} images: "
            "send one placeholder per image, in the ids before expansion"
        )
    encoded = processor(text=[token * count], images=images, add_special_tokens=False, return_tensors="pt")
    joint = encoded["input_ids"][0].tolist()
    alone = [joint] if count == 1 else [one_image_ids(processor, token, image) for image in images]
    if [t for ids in alone for t in ids] != joint:
        raise ValueError(f"{type(processor).__name__} expands an image's placeholder differently beside others")
    ids, spans, expansions = [], [], iter(alone)
    for t in template_ids:
        if t == token_id:
            expansion = next(expansions)
            spans.append((len(ids), len(expansion)))
            ids.extend(expansion)
        else:
            ids.append(t)
    tensors = {name: value for name, value in encoded.items() if name not in TOKEN_KEYS}
    return RenderedPrompt(ids, VisionInputs(tensors, image_dims(tensors))), spans


def one_image_ids(processor, token: str, image: Image.Image) -> list[int]:
    """The ids the processor expands one image's placeholder `token` into."""
    return list(processor(text=[token], images=[image], add_special_tokens=False)["input_ids"][0])


def image_dims(tensors: dict) -> dict[str, int]:
    """Each tensor's image dimension. Processors with nested images (Idefics3/SmolVLM: pixel_values
    [batch, tiles, C, H, W]) give every tensor that shares pixel_values' [batch, tiles] prefix dimension
    1; the flat layouts (Qwen-VL's patches and grids, LLaVA's [images, C, H, W]) count images along 0."""
    pixels = tensors.get("pixel_values")
    nested = pixels is not None and pixels.ndim == 5
    return {
        name: 1 if nested and tensor.ndim >= 2 and tensor.shape[:2] == pixels.shape[:2] else 0
        for name, tensor in tensors.items()
    }


def load_processor(path: str):
    """The model's AutoProcessor; without torchvision, the model's processor class without its video part.

    transformers builds the Qwen-VL (and SmolVLM) processors with a video processor, which needs
    torchvision, and refuses to build them when it is missing, images or not. Prompts here hold images
    only, so on such a machine the same processor class is built with its image processor (the PIL one
    transformers picks without torchvision) and tokenizer only.
    """
    from transformers import AutoConfig, AutoProcessor
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES, processor_class_from_name
    from transformers.utils import is_torchvision_available

    name = PROCESSOR_MAPPING_NAMES.get(AutoConfig.from_pretrained(path).model_type)
    cls = processor_class_from_name(name) if name else None
    if cls is None or is_torchvision_available() or "video_processor" not in cls.get_attributes():
        return AutoProcessor.from_pretrained(path)
    return without_video(cls).from_pretrained(path)


def without_video(cls: type) -> type:
    """A subclass of processor class `cls` whose only parts are its image processor and tokenizer.

    transformers' from_pretrained passes a processor only the arguments its `__init__` names, so the
    subclass names those of the Qwen-VL processors (image_processor, tokenizer, video_processor,
    chat_template) less video_processor; a class that takes more (SmolVLM's image_seq_len) is refused
    rather than built with that setting silently at its default.
    """
    known = {"self", "image_processor", "tokenizer", "video_processor", "chat_template", "kwargs"}
    extra = [p for p in inspect.signature(cls.__init__).parameters if p not in known]
    if extra:
        raise ValueError(
            f"{cls.__name__} needs a video processor (torchvision) and takes {extra}, which grpokit cannot "
            "pass without one: install torchvision"
        )

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        cls.__init__(self, image_processor, tokenizer, video_processor=None, chat_template=chat_template, **kwargs)

    return type(cls.__name__, (cls,), {"__init__": __init__, "__doc__": f"{cls.__name__} without its video part."})


def check_vision_model(path: str, where: str) -> None:
    """Refuse a text-only policy for data with images; `where` says which ("environment 'x' (example 3)",
    "data.path 'sft.jsonl' example 0")."""
    from transformers import AutoConfig

    from grpokit.common.models import is_vision_language

    config = AutoConfig.from_pretrained(path)
    if not is_vision_language(config):
        raise ValueError(
            f"{where} has images, but the policy {path!r} is a text-only model ({config.model_type}): set "
            "model.model to a vision-language model (Qwen2.5-VL, Idefics3/SmolVLM, smollm2-135m-vision) or use "
            "data without images"
        )


def save_tokenizer(name: str, folder) -> None:
    """Model `name`'s tokenizer saved into `folder` and, for a vision-language model, its processor too (the
    image processor's settings, the image tokens), so the folder renders prompts as `name` does."""
    from transformers import AutoConfig

    from grpokit.common.models import is_vision_language, load_tokenizer, resolve_model

    load_tokenizer(name).save_pretrained(folder)
    path = resolve_model(name)
    if is_vision_language(AutoConfig.from_pretrained(path)):
        save_processor(load_processor(path), folder)


def save_processor(processor, folder) -> None:
    """`processor.save_pretrained(folder)`, loadable where torchvision is installed as well as where it is not.

    A processor built without its video part (load_processor on a machine without torchvision) saves no
    video processor settings, and transformers, given torchvision, then refuses to build the processor
    from the folder ("Can't load video processor"). Its image processor's settings are therefore also
    written as the legacy preprocessor_config.json, from which transformers builds the video part, as it
    does for the Qwen2.5-VL checkpoints on the hub (harmless for a family without a video part: the
    nested processor_config.json comes first).
    """
    processor.save_pretrained(folder)
    if getattr(processor, "image_processor", None) is not None and getattr(processor, "video_processor", None) is None:
        processor.image_processor.to_json_file(str(Path(folder) / "preprocessor_config.json"))
