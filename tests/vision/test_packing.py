"""A packed row of two image sequences scores each sequence as it scores alone (issue 36, must-show 1)."""

from __future__ import annotations

import pytest
import torch

from grpokit.vision.inputs import concat
from grpokit.vision.logprobs import packed_vision_logprobs, use_varlen_text
from grpokit.vision.positions import packed_position_ids
from grpokit.vision.render import render_prompt
from grpokit.vision.sample import sample_completion
from tests.vision.pictures import striped


def sequence(processor, model, n_images: int, seed: int):
    """(ids, vision inputs) of a prompt with `n_images` images and a greedy completion of 6 tokens."""
    content = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": f"Describe {seed}."}]
    images = [striped(42 + 14 * i, 56, seed + i) for i in range(n_images)]
    prompt = render_prompt(processor, [{"role": "user", "content": content}], images)
    completion = sample_completion(model, prompt, max_tokens=6)
    return torch.tensor(prompt.prompt_ids + completion.token_ids), prompt.vision


@pytest.mark.parametrize("attention", ["dense", "varlen"])
def test_a_packed_row_of_two_image_sequences_equals_each_alone(vl_family, attention):
    """Dense: the [T, T] block-diagonal mask; varlen: grpokit's per-sequence attention on the text model."""
    from transformers import AutoModelForImageTextToText

    _, path, processor, model = vl_family
    (ids_a, vision_a), (ids_b, vision_b) = sequence(processor, model, 1, seed=1), sequence(processor, model, 2, seed=4)
    if attention == "varlen":  # a model of its own, for scoring only: the session's stays on SDPA
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
        use_varlen_text(model)
    with torch.no_grad():
        alone = [
            packed_vision_logprobs(model, ids, torch.tensor([len(ids)]), vision)
            for ids, vision in ((ids_a, vision_a), (ids_b, vision_b))
        ]
        seq_lens_N = torch.tensor([len(ids_a), len(ids_b)])
        packed_T = packed_vision_logprobs(model, torch.cat([ids_a, ids_b]), seq_lens_N, concat([vision_a, vision_b]))
    torch.testing.assert_close(packed_T, torch.cat(alone), atol=1e-5, rtol=0)
    assert packed_T[len(ids_a)] == 0  # the second sequence's first token has no prediction


def test_packed_positions_restart_per_sequence(vl_family):
    family, _, processor, model = vl_family
    (ids_a, vision_a), (ids_b, vision_b) = sequence(processor, model, 2, seed=2), sequence(processor, model, 1, seed=7)
    alone_a = packed_position_ids(model, ids_a, torch.tensor([len(ids_a)]), vision_a)
    alone_b = packed_position_ids(model, ids_b, torch.tensor([len(ids_b)]), vision_b)
    packed = packed_position_ids(
        model, torch.cat([ids_a, ids_b]), torch.tensor([len(ids_a), len(ids_b)]), concat([vision_a, vision_b])
    )
    assert torch.equal(packed, torch.cat([alone_a, alone_b], dim=-1))
    if family == "qwen2_5_vl":  # 3-D: an image's tokens share their time position, so the text ends early
        assert packed.shape == (3, len(ids_a) + len(ids_b))
        assert int(alone_a.max()) < len(ids_a) - 1
    else:
        assert torch.equal(alone_a, torch.arange(len(ids_a)))
