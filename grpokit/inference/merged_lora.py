"""Sampling with the LoRA adapter merged into the weights: W' = W + s * B @ A, one matmul per layer.

peft's unmerged LoRA layer computes y = W x + s * B (A x) on every call: two more matmuls, a scale
and an add per adapted projection, each a separate kernel and Python call. At the CPU demo's decode
shape (32 rows of one token, LoRA on the 7 projections of SmolLM2-135M's 30 layers) that is 16% of
the engine's time (3.24 s against 2.72 s per step, measured side by side). The engine samples
thousands of tokens per weight update, so it pays to fold the adapter in once per update instead.

`MergedLoRA` keeps the merged weights W' in tensors of its own (the base W stays untouched: in
co-locate `fit` it is the trainer's frozen base, grpokit.inference.builtin.share_base_weights) and
swaps them in only while sampling, marking each layer as merged the way peft does
(`merged_adapters`), so peft's forward runs the base layer alone. Outside `active()` the model is
the plain peft model again: loading the next adapter, checksums and sharing see what they expect.
The delta comes from peft (`get_delta_weight`: scaling, rsLoRA, rank and alpha patterns,
fan_in_fan_out), so nothing of LoRA's math is written again here.

Float32 only by default: in bfloat16, adding a small s * B @ A to W rounds it to W's precision
(8 bits of mantissa) and loses most of the adapter's update; LoRA variants such as DoRA do not
merge as a plain sum and keep the unmerged path (`mergeable`).
"""

from __future__ import annotations

import contextlib

import torch


def _lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    from peft.tuners.lora.layer import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def mergeable(model: torch.nn.Module) -> bool:
    """Whether every LoRA layer of this peft model is a plain linear adapter that merges as W + s * B @ A
    (no DoRA or other variant, no embedding or convolution adapter, one adapter)."""
    from peft.tuners.lora.layer import Linear

    layers = _lora_layers(model)
    return bool(layers) and all(
        type(m) is Linear and not m.lora_variant and list(m.lora_A) == ["default"] for m in layers.values()
    )


class MergedLoRA:
    """The adapter of a peft model folded into merged copies of its base weights, swapped in while sampling."""

    def __init__(self, model: torch.nn.Module) -> None:
        if not mergeable(model):
            raise ValueError(
                "inference.init_args.merge_lora: this adapter does not merge as W + s * "
                "B @ A (DoRA, several adapters or non-linear layers); set merge_lora: off"
            )
        self.layers = _lora_layers(model)
        self.merged = {
            name: torch.empty_like(m.base_layer.weight, requires_grad=False) for name, m in self.layers.items()
        }

    @torch.no_grad()
    def refresh(self) -> None:
        """W' = W + delta for every layer; call after each adapter load."""
        for name, m in self.layers.items():
            torch.add(
                m.base_layer.weight, m.get_delta_weight("default").to(m.base_layer.weight.dtype), out=self.merged[name]
            )

    @contextlib.contextmanager
    def active(self):
        """Within: every LoRA layer's base weight is its merged copy and peft skips the adapter."""
        bases = {}
        try:
            for name, m in self.layers.items():
                bases[name] = m.base_layer.weight
                m.base_layer.weight = torch.nn.Parameter(self.merged[name], requires_grad=False)
                m.merged_adapters = ["default"]
            yield
        finally:
            for name, weight in bases.items():
                self.layers[name].base_layer.weight = weight
                self.layers[name].merged_adapters = []
