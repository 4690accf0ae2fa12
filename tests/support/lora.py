"""A LoRA weight update for the suite's tiny model, as the trainer publishes one."""

from __future__ import annotations

import torch

from grpokit.types import WeightUpdate


def tiny_lora_update(step: int, scale: float = 1.0, rank: int = 4):
    """A WeightUpdate carrying a random LoRA adapter (q_proj, v_proj; seed 0, times `scale`) for the tiny
    model of build_tiny_model, as the trainer publishes one: peft's state-dict names and its config."""
    lora_config = {"r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj", "v_proj"]}
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in range(2):
        for proj, out in (("q_proj", 64), ("v_proj", 32)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, 64, generator=g) * 0.5 * scale
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out, rank, generator=g) * 0.5
    return WeightUpdate(step=step, tensors=tensors, lora_config=lora_config)
