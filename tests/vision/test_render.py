"""grpokit.vision.render: a prompt's ids hold exactly the image placeholders the processor computes."""

from __future__ import annotations

import pytest

from grpokit.vision.render import render_prompt
from tests.vision.pictures import striped


def expected_placeholders(family: str, processor, vision) -> int:
    """The processor's own count: Qwen-VL grid t*h*w / merge_size^2 per image; Idefics3 image_seq_len per
    tile (the tiles of every image, global ones included, are pixel_values' dimension 1)."""
    if family == "qwen2_5_vl":
        merge = processor.image_processor.merge_size
        return int((vision.tensors["image_grid_thw"].prod(-1) // merge**2).sum())
    return processor.image_seq_len * vision.tensors["pixel_values"].shape[1]


@pytest.mark.parametrize("sizes", [[(56, 56)], [(90, 40), (30, 70)]], ids=["one image", "two images"])
def test_the_prompt_holds_the_processors_number_of_placeholders(vl_family, sizes):
    family, _, processor, model = vl_family
    content = [{"type": "image"} for _ in sizes] + [{"type": "text", "text": "What is shown?"}]
    images = [striped(w, h, seed=i) for i, (w, h) in enumerate(sizes)]
    rendered = render_prompt(processor, [{"role": "user", "content": content}], images)
    found = rendered.prompt_ids.count(model.config.image_token_id)
    assert found == expected_placeholders(family, processor, rendered.vision)
    if family == "qwen2_5_vl":
        assert rendered.vision.tensors["image_grid_thw"].shape[0] == len(sizes)
        assert rendered.vision.image_dims == {"pixel_values": 0, "image_grid_thw": 0}
    else:
        assert rendered.vision.image_dims == {"pixel_values": 1, "pixel_attention_mask": 1}


def test_hand_counted_placeholders_of_one_56_pixel_image(vl_family):
    """56x56: Qwen2.5-VL's grid is 1 x 4 x 4 patches of 14 pixels, merged 2x2 -> 4 tokens. Idefics3 first
    resizes the longest edge to `size` (112), then splits into 56-pixel tiles: 2 x 2 tiles plus the
    global image, 4 tokens (image_seq_len) each -> 20."""
    family, _, processor, model = vl_family
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}]
    rendered = render_prompt(processor, messages, [striped(56, 56, seed=0)])
    assert rendered.prompt_ids.count(model.config.image_token_id) == (4 if family == "qwen2_5_vl" else 20)
    if family == "qwen2_5_vl":
        assert rendered.vision.tensors["image_grid_thw"].tolist() == [[1, 4, 4]]


def test_keep_source_holds_the_pictures_and_the_ids_before_expansion(vl_family):
    """What VLLMEngine sends vLLM (grpokit.inference.vllm.images): the pictures, and the ids with one
    placeholder per picture, the rest as the expanded ids; never serialised with the tensors."""
    from grpokit.vision.inputs import VisionInputs

    _, _, processor, model = vl_family
    content = [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "What is shown?"}]
    images = [striped(56, 56, seed=1), striped(70, 42, seed=2)]
    rendered = render_prompt(processor, [{"role": "user", "content": content}], images, keep_source=True)
    source, image = rendered.vision.source, model.config.image_token_id
    assert source.images == images and source.prompt_ids == rendered.prompt_ids
    assert source.template_ids.count(image) == 2 < rendered.prompt_ids.count(image)
    assert source.template_ids[-4:] == rendered.prompt_ids[-4:] and source.template_ids[:2] == rendered.prompt_ids[:2]
    assert render_prompt(processor, [{"role": "user", "content": content}], images).vision.source is None
    assert VisionInputs.from_tensors(*rendered.vision.to_tensors()).source is None


def test_a_saved_processor_without_its_video_part_still_names_video_settings(vl_family, tmp_path):
    """Where torchvision is missing, load_processor builds Qwen2.5-VL's processor without its video part;
    saved as is, a machine with torchvision could not load the folder ("Can't load video processor": the
    H200 check of 2026-11-29). save_processor also writes the image settings as preprocessor_config.json,
    from which transformers builds the video part, as for the hub's checkpoints."""
    from transformers.video_processing_utils import BaseVideoProcessor

    from grpokit.vision.render import save_processor

    family, _, processor, _ = vl_family
    save_processor(processor, tmp_path)
    legacy = tmp_path / "preprocessor_config.json"
    assert legacy.is_file()
    if family == "qwen2_5_vl":
        settings, _ = BaseVideoProcessor.get_video_processor_dict(str(tmp_path))
        assert settings["patch_size"] == processor.image_processor.patch_size
        assert settings["merge_size"] == processor.image_processor.merge_size
