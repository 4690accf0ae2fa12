"""grpokit.vision.inputs: VisionInputs through its header + tensors form and a safetensors file; packing."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from grpokit.vision.inputs import VisionInputs, concat


def qwen_like(n_images: int, seed: int) -> VisionInputs:
    g = torch.Generator().manual_seed(seed)
    grids = torch.tensor([[1, 4, 4]] * n_images)
    return VisionInputs(
        {"pixel_values": torch.randn(16 * n_images, 12, generator=g), "image_grid_thw": grids},
        {"pixel_values": 0, "image_grid_thw": 0},
    )


def idefics_like(n_tiles: int) -> VisionInputs:
    return VisionInputs(
        {
            "pixel_values": torch.rand(1, n_tiles, 3, 4, 4),
            "pixel_attention_mask": torch.ones(1, n_tiles, 4, 4, dtype=torch.long),
        },
        {"pixel_values": 1, "pixel_attention_mask": 1},
    )


@pytest.mark.parametrize("inputs", [qwen_like(2, 0), idefics_like(3), VisionInputs()], ids=["flat", "nested", "none"])
def test_round_trip_through_a_safetensors_file(tmp_path, inputs):
    tensors, header = inputs.to_tensors()
    assert all(isinstance(v, str) for v in header.values())  # safetensors metadata is str -> str
    path = tmp_path / "batch.safetensors"
    save_file({**tensors, "0.input_ids": torch.arange(5)}, path, metadata=header)  # beside a batch's tensors
    with safe_open(path, framework="pt") as f:
        read = {name: f.get_tensor(name) for name in f.keys()}
        metadata = f.metadata()
    back = VisionInputs.from_tensors(read, metadata)
    assert back.image_dims == inputs.image_dims
    assert set(back.tensors) == set(inputs.tensors)
    for name, tensor in inputs.tensors.items():
        assert back.tensors[name].dtype == tensor.dtype
        assert torch.equal(back.tensors[name], tensor)


def test_a_header_of_another_format_or_missing_tensors_is_refused():
    tensors, header = qwen_like(1, 0).to_tensors()
    with pytest.raises(ValueError, match="not a grpokit.VisionInputs header of version 1"):
        VisionInputs.from_tensors(tensors, {**header, "version": "9"})
    with pytest.raises(ValueError, match=r"not there: \['vision.image_grid_thw'\]"):
        VisionInputs.from_tensors({"vision.pixel_values": tensors["vision.pixel_values"]}, header)
    with pytest.raises(ValueError, match="image_dims names"):
        VisionInputs({"pixel_values": torch.zeros(1)}, {})


def test_concat_joins_each_tensor_along_its_image_dimension_in_row_order():
    a, b = qwen_like(1, 1), qwen_like(2, 2)
    packed = concat([a, VisionInputs(), b])  # a text-only sequence adds nothing
    assert packed.tensors["image_grid_thw"].tolist() == [[1, 4, 4]] * 3
    assert torch.equal(
        packed.tensors["pixel_values"], torch.cat([a.tensors["pixel_values"], b.tensors["pixel_values"]])
    )
    nested = concat([idefics_like(2), idefics_like(5)])
    assert nested.tensors["pixel_values"].shape == (1, 7, 3, 4, 4)
    assert nested.tensors["pixel_attention_mask"].shape == (1, 7, 4, 4)
    assert not concat([VisionInputs(), VisionInputs()])
    with pytest.raises(ValueError, match="different model inputs"):
        concat([qwen_like(1, 0), idefics_like(1)])
