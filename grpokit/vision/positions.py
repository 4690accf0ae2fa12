"""Position ids of a (packed) token row with images: the model's own rule, restarting per sequence.

The Qwen-VL family rotates by 3-D positions (time, height, width): an image's tokens take their grid
coordinates and the text after it continues from the largest one, so a sequence's positions are not
0..T-1. They come from the model's own `get_rope_index` (on `model.model` in transformers 5), never
re-derived here, so a new family member with another rule is followed. Other families (Idefics3,
LLaVA) use plain 0..T-1. A packed row gets each sequence's positions on its own, concatenated (each
restarting at 0), so a sequence scores the same alone or packed.
"""

from __future__ import annotations

import torch

from grpokit.common.models import unwrap_peft
from grpokit.vision.inputs import VisionInputs


def rope_index_owner(model: torch.nn.Module):
    """The module with the model's `get_rope_index` (the Qwen-VL family's base model), or None."""
    base = unwrap_peft(model)
    for candidate in (getattr(base, "model", None), base):
        if candidate is not None and hasattr(candidate, "get_rope_index"):
            return candidate
    return None


def mm_token_type_ids(config, input_ids: torch.Tensor) -> torch.Tensor:
    """Per token: 0 text, 1 image placeholder, 2 video placeholder (what get_rope_index groups by)."""
    types = (input_ids == config.image_token_id).long()
    video = getattr(config, "video_token_id", None)
    return types if video is None else types + 2 * (input_ids == video).long()


def packed_position_ids(
    model: torch.nn.Module, input_ids_T: torch.Tensor, seq_lens_N: torch.Tensor, vision: VisionInputs
) -> torch.Tensor:
    """Position ids for a row of sequences of lengths `seq_lens_N`: [3, T] for the Qwen-VL family, else
    [T]. Each sequence takes its own images' rows of `image_grid_thw`, in order."""
    owner = rope_index_owner(model)
    if owner is None:
        return torch.cat([torch.arange(int(n), device=input_ids_T.device) for n in seq_lens_N])
    config = unwrap_peft(model).config
    grids = vision.tensors.get("image_grid_thw")
    parts, used = [], 0
    for ids_S in torch.split(input_ids_T, seq_lens_N.tolist()):
        types_S = mm_token_type_ids(config, ids_S)
        n_images = _runs(types_S == 1)
        grid = grids[used : used + n_images].to(ids_S.device) if n_images else None
        positions, _ = owner.get_rope_index(ids_S[None], types_S[None], image_grid_thw=grid)
        parts.append(positions[:, 0])  # [3, S]
        used += n_images
    if grids is not None and used != grids.shape[0]:
        raise ValueError(f"the row's image placeholders make {used} images, but image_grid_thw has {grids.shape[0]}")
    return torch.cat(parts, dim=1)


def _runs(flags_T: torch.Tensor) -> int:
    """How many runs of consecutive True `flags_T` has (one per image: each image's placeholders are
    contiguous, and the family's templates put a vision_start/vision_end token between two images)."""
    starts = flags_T[1:] & ~flags_T[:-1]
    return int(starts.sum()) + int(bool(flags_T[:1].any()))
