"""The tiny random vision-language models, one per family, built once per session."""

from __future__ import annotations

import pytest

from grpokit.testing.vision_models import build_tiny_idefics3, build_tiny_qwen2_5_vl

BUILDERS = {"qwen2_5_vl": build_tiny_qwen2_5_vl, "idefics3": build_tiny_idefics3}


@pytest.fixture(scope="session", params=sorted(BUILDERS))
def vl_family(request, tmp_path_factory):
    """(family name, model folder, processor, float32 model in eval mode)."""
    import torch
    from transformers import AutoModelForImageTextToText

    from grpokit.vision.render import load_processor

    path = str(BUILDERS[request.param](tmp_path_factory.mktemp(request.param)))
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    return request.param, path, load_processor(path), model
