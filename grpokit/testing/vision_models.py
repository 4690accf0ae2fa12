"""The tests' tiny random vision-language models, one per family, built offline with a working processor.

Each is saved to a folder that grpokit.vision.render.load_processor and transformers'
AutoModelForImageTextToText load: SmolLM2's tokenizer (as the tiny text model's, grpokit.testing.models)
with the family's image tokens added, the family's PIL image processor (no torchvision needed), and a
ChatML template that puts the family's image marker where a `{"type": "image"}` part is. Random
weights, hidden 64, 2 text layers, a 1-layer vision tower: a forward takes milliseconds. Images are
kept small by the processors' settings (Qwen2.5-VL: 4 to 64 merged patches; Idefics3: 56-pixel tiles
of 4 tokens, at most 2x2 tiles plus the global one).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}IMAGE{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _text_config(tokenizer) -> dict:
    """The text model's shape, shared by both families: 2 layers, hidden 64, head_dim 32, one KV head."""
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def build_tiny_qwen2_5_vl(path, seed: int = 0, tokenizer_name: str = "smollm2-135m"):
    """A random Qwen2.5-VL (3-D rotary positions, patch merger, windowed vision attention) saved to `path`
    (returned); `tokenizer_name`: SmolLM2's tokenizer (a folder holding it, on a machine without the GGUF)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from grpokit.common.models import load_tokenizer
    from grpokit.vision.render import without_video

    tokenizer = load_tokenizer(tokenizer_name)
    marks = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": marks})
    image_processor = Qwen2VLImageProcessorPil(min_pixels=4 * 28 * 28, max_pixels=64 * 28 * 28)
    template = CHATML.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>")
    processor = without_video(Qwen2_5_VLProcessor)(image_processor, tokenizer, chat_template=template)
    token = tokenizer.convert_tokens_to_ids
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]}  # sums to head_dim / 2
    config = Qwen2_5_VLConfig(
        text_config={**_text_config(tokenizer), "rope_parameters": rope},
        vision_config={
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "window_size": 56,
            "fullatt_block_indexes": [0],
        },
        image_token_id=token("<|image_pad|>"),
        video_token_id=token("<|video_pad|>"),
        vision_start_token_id=token("<|vision_start|>"),
        vision_end_token_id=token("<|vision_end|>"),
        tie_word_embeddings=True,
    )
    return _save(Qwen2_5_VLForConditionalGeneration, config, processor, path, seed, "Qwen2_5_VLProcessor")


def build_tiny_idefics3(path, seed: int = 0, tokenizer_name: str = "smollm2-135m"):
    """A random Idefics3 (SmolVLM's architecture: a Llama text model, image tiles, pixel shuffle) saved to
    `path` (returned); `tokenizer_name` as for build_tiny_qwen2_5_vl."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    from grpokit.common.models import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_name)
    tiles = [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]
    marks = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", *tiles]
    tokenizer.add_special_tokens({"additional_special_tokens": marks})
    image_processor = Idefics3ImageProcessorPil(size={"longest_edge": 112}, max_image_size={"longest_edge": 56})
    processor = Idefics3Processor(
        image_processor, tokenizer, image_seq_len=4, chat_template=CHATML.replace("IMAGE", "<image>")
    )  # 4 = (56 / 14)^2 patches / scale_factor^2
    config = Idefics3Config(
        text_config={"model_type": "llama", **_text_config(tokenizer), "head_dim": 32},
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 56,
            "patch_size": 14,
        },
        scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    return _save(Idefics3ForConditionalGeneration, config, processor, path, seed, "Idefics3Processor")


def _save(model_class, config, processor, path, seed: int, processor_class: str):
    """A random `model_class(config)` and `processor` saved to `path`; the processor config names the
    family's own processor class (the one AutoProcessor builds where torchvision is installed)."""
    from grpokit.vision.render import save_processor

    torch.manual_seed(seed)
    model_class(config).save_pretrained(path)
    save_processor(processor, path)
    config_file = Path(path) / "processor_config.json"
    saved = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**saved, "processor_class": processor_class}, indent=2) + "\n")
    return path
