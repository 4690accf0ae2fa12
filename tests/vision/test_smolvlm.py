"""smollm2-135m-vision (grpokit.vision.smolvlm): a real small vision-language model built from SmolLM2-135M:
its language model is SmolLM2-135M-Instruct's weights unchanged (text logits equal), a picture becomes 16
image tokens through its processor, the tower and projector are the small random ones, and a forward
with a picture runs."""

from __future__ import annotations

import random

import torch

from grpokit.common.models import BUILT_ALIASES, load_causal_lm, load_tokenizer
from grpokit.envs.shapes import draw_shape
from grpokit.trainer.vision_parts import part_of
from grpokit.vision.render import load_processor, render_prompt
from grpokit.vision.smolvlm import ALIAS, IMAGE_SEQ_LEN, build_smollm2_vision


def test_the_built_model_is_smollm2_with_a_small_vision_tower(tmp_path):
    assert ALIAS in BUILT_ALIASES
    folder = tmp_path / "vlm"
    build_smollm2_vision(folder)
    vlm, text = load_causal_lm(str(folder)).eval(), load_causal_lm("smollm2-135m").eval()
    assert type(vlm).__name__ == "Idefics3ForConditionalGeneration"
    counts = {part: 0 for part in ("tower", "projector", "text")}
    for name, param in vlm.named_parameters():
        counts[part_of(name)] += param.numel()
    assert counts["tower"] == 1_829_184 and counts["projector"] == 442_368, counts

    ids = load_tokenizer("smollm2-135m")("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ours, theirs = vlm(input_ids=ids).logits, text(input_ids=ids).logits
    vocab = theirs.shape[-1]
    torch.testing.assert_close(ours[..., :vocab], theirs, atol=1e-4, rtol=1e-4)  # the real language model

    processor = load_processor(str(folder))
    shaped = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]}]
    for size in (64, 100):
        picture = draw_shape("circle", "red", size, random.Random(0))
        prompt = render_prompt(processor, shaped, [picture])
        image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
        assert prompt.prompt_ids.count(image_id) == IMAGE_SEQ_LEN == 16
        assert tuple(prompt.vision.tensors["pixel_values"].shape) == (1, 1, 3, 64, 64)
    with torch.no_grad():
        logits = vlm(input_ids=torch.tensor([prompt.prompt_ids]), **prompt.vision.tensors).logits
    assert torch.isfinite(logits).all()
