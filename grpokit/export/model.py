"""The trainer's model rebuilt from a run's saved settings and one step's weights, and merged for export.

The model is built the way grpokit.trainer.model_setup builds it (the same base, `add_lora` with the
run's `model.lora`), so a checkpoint's `lm.` names fit it as they fit the trainer's. Differences, on
purpose:
- An adapter export builds the base on the meta device: only the adapter's tensors are real, so
  exporting a LoRA adapter of a 70B run needs no memory for the 70B.
- A QLoRA run's base (`model.quantization: nf4`) is loaded as the trainer loaded it, 4-bit NF4 with
  double-quantized scales, and then dequantized (transformers' `dequantize`): its linear weights are the
  NF4 values the adapter was trained against, not the original ones, which differ by up to ~1/7 of each
  block's largest weight. The merge adds the adapter to those.
- A tied input embedding and LM head stay one tensor unless the adapter adapts one of them (a
  `target_modules` entry naming `lm_head` or `embed_tokens`): merging into the shared tensor would
  change both, so the head gets its own copy and the config `tie_word_embeddings: false` first.
"""

from __future__ import annotations

import torch

from grpokit.common.models import load_causal_lm, parse_dtype, resolve_model
from grpokit.export.sources import RunSettings, WeightSource
from grpokit.trainer.lora import add_lora


def trained_model(settings: RunSettings, source: WeightSource, base_weights: bool) -> torch.nn.Module:
    """The trainer's model with `source`'s weights, in eval mode: a peft model for a LoRA run. Without
    `base_weights` the base lies on the meta device (enough to write the adapter)."""
    lm = base_model(settings) if base_weights else empty_base(settings)
    if settings.lora is not None:
        lm = add_lora(lm, settings.lora, gradient_checkpointing=False)
    source.load_into(lm)
    return lm.eval()


def base_model(settings: RunSettings) -> torch.nn.Module:
    """The run's base model in the run's dtype; a QLoRA run's NF4 base dequantized."""
    if settings.quantization is None:
        return load_causal_lm(settings.model, dtype=parse_dtype(settings.dtype))
    try:
        import bitsandbytes  # noqa: F401  (transformers' NF4 loader needs it)
    except ImportError as e:
        raise ImportError(
            f"this run trained on a {settings.quantization} base (QLoRA): merging rebuilds that base with "
            "bitsandbytes, which is not installed. Install it (`pip install grpokit[qlora]`), or export the "
            "adapter alone (no --merge)"
        ) from e
    lm = load_causal_lm(settings.model, dtype=parse_dtype(settings.dtype), quantization=settings.quantization)
    return lm.dequantize()


def empty_base(settings: RunSettings) -> torch.nn.Module:
    """The run's base model architecture on the meta device (no weights read), named by its resolved path
    (peft writes that name into adapter_config.json as base_model_name_or_path)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = resolve_model(settings.model)
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=parse_dtype(settings.dtype))
    lm.name_or_path = path
    return lm


def merged_model(lm: torch.nn.Module) -> torch.nn.Module:
    """A LoRA `lm` (peft) as a plain transformers model with the adapter added into its weights."""
    untie_adapted_embeddings(lm)
    return lm.merge_and_unload()


def untie_adapted_embeddings(lm: torch.nn.Module) -> bool:
    """Give the LM head its own weight when the embeddings are tied and the adapter adapts the head or
    the input embedding (so a merge changes only the adapted one); returns whether it untied."""
    from peft.tuners.lora import LoraLayer

    base = lm.get_base_model()
    configs = {id(c): c for c in (base.config, base.config.get_text_config())}.values()
    if not any(getattr(c, "tie_word_embeddings", False) for c in configs):
        return False
    head = base.get_output_embeddings()
    if not any(isinstance(m, LoraLayer) for m in (base.get_input_embeddings(), head)):
        return False
    layer = head.get_base_layer() if isinstance(head, LoraLayer) else head
    layer.weight = torch.nn.Parameter(layer.weight.detach().clone(), requires_grad=False)
    for config in configs:
        config.tie_word_embeddings = False
    return True
