"""`smollm2-135m-vision`: a small real vision-language model, built here from SmolLM2-135M-Instruct.

No pretrained vision-language model can be downloaded on grpokit's CPU machines, so this one is
assembled the way SmolVLM-256M is (transformers' Idefics3 architecture, LLaVA-style: vision encoder ->
projector -> language model):
- the language model is SmolLM2-135M-Instruct's real weights (the embedded `smollm2-135m`), unchanged;
  the tokenizer gains Idefics3's four image tokens, whose new embedding rows start at the mean row;
- the vision encoder is a small SigLIP-style ViT (Idefics3VisionTransformer: 64x64 pictures in 8x8
  patches, hidden 192, 4 layers, 1.8M parameters), randomly initialised with `seed`;
- the projector is Idefics3's connector: a 2x2 pixel shuffle and one linear map into the text model's
  hidden size (0.44M parameters), random too.
So a picture becomes 16 image tokens. The encoder and projector know nothing until trained:
recipes/shapes_vision_pipeline.yaml pretrains the encoder on labelled pictures (`grpokit pretrain-vision`,
as LLaVA starts from a pretrained CLIP), aligns the projector with `grpokit sft`, then trains with GRPO
(docs/vision.md). The processor is Idefics3's with its PIL image
processor (no torchvision): each picture resized to 64 pixels on its longest edge, no tiling; the chat
template is ChatML with `<image>` where an image part is (no default system prompt).

Built once on first use (`resolve_model`) into the grpokit cache, atomically; the same seed gives the
same weights.
"""

from __future__ import annotations

from pathlib import Path

import torch

ALIAS = "smollm2-135m-vision"
FOLDER = "SmolLM2-135M-Vision"
IMAGE_SIZE, PATCH_SIZE, SCALE_FACTOR = 64, 8, 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2  # 16 tokens per picture
IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]


def chatml_with_images(image_marker: str) -> str:
    """ChatML that renders a `{"type": "image"}` content part as `image_marker` and text parts as their text
    (the processor expands the marker into the picture's tokens)."""
    return (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
        f"{{% if part['type'] == 'image' %}}{image_marker}{{% elif part['type'] == 'text' %}}{{{{ part['text'] }}}}"
        "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


def build_smollm2_vision(target: Path, seed: int = 0) -> None:
    """Build the model and its processor into `target` (written to a temp folder, then renamed)."""
    from transformers import AutoModelForCausalLM, Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    from grpokit.common.io import atomic_folder
    from grpokit.common.models import load_tokenizer, resolve_model

    text = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m"), dtype=torch.float32)
    tokenizer = load_tokenizer("smollm2-135m")
    tokenizer.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS})
    size = {"longest_edge": IMAGE_SIZE}
    image_processor = Idefics3ImageProcessorPil(size=size, max_image_size=size, do_image_splitting=False)
    processor = Idefics3Processor(
        image_processor, tokenizer, image_seq_len=IMAGE_SEQ_LEN, chat_template=chatml_with_images("<image>")
    )
    config = Idefics3Config(
        text_config={**text.config.to_dict(), "vocab_size": len(tokenizer)},
        vision_config={
            "hidden_size": 192,
            "intermediate_size": 768,
            "num_hidden_layers": 4,
            "num_attention_heads": 3,
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH_SIZE,
        },
        scale_factor=SCALE_FACTOR,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config)
    weights = text.model.state_dict()
    embeddings = weights["embed_tokens.weight"]
    added = len(tokenizer) - embeddings.shape[0]
    weights["embed_tokens.weight"] = torch.cat([embeddings, embeddings.mean(0, keepdim=True).expand(added, -1)])
    model.model.text_model.load_state_dict(weights, strict=True)
    model.tie_weights()  # the output head is the (grown) embedding, as SmolLM2's
    with atomic_folder(target, keep_existing=True) as tmp:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)


def smollm2_vision_folder() -> str:
    """The cached model folder of `smollm2-135m-vision`, built on first use."""
    from grpokit.common.models import cache_dir

    target = cache_dir() / "models" / FOLDER
    if not (target / "config.json").is_file():
        build_smollm2_vision(target)
    return str(target)
