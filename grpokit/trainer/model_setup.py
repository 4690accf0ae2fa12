"""The trainer's model, built from the recipe's `model.*` settings: load the base (or NF4 for QLoRA),
wrap it in LoRA, choose the attention path, compile the decoder layers, shard it with FSDP2.

Also the device-dependent defaults the Policy asks about (`auto` attention, sharing prefixes, the
log-probability chunk size): each is a function of the settings and the training device, so the bench
(no Lightning Trainer) and `grpokit fit` decide alike.
"""

from __future__ import annotations

import torch

from grpokit.common.models import compile_decoder_layers, is_vision_language, load_causal_lm, parse_dtype
from grpokit.common.varlen import use_varlen
from grpokit.trainer.fsdp import shard_model
from grpokit.trainer.lora import LoraSettings, add_lora
from grpokit.trainer.quantization import check_nf4
from grpokit.trainer.vision_parts import VisionTraining, freeze_vision, vision_modules
from grpokit.vision.logprobs import use_varlen_text


def uses_varlen(attention: str, device: torch.device) -> bool:
    """model.attention: varlen, or auto on CUDA (per-sequence flash attention, grpokit.common.varlen)."""
    return attention == "varlen" or (attention == "auto" and device.type == "cuda")


def shares_prefixes(setting: bool | None, attention: str, lora: LoraSettings | None, device: torch.device) -> bool:
    """model.share_prefixes, or its default: on with dense attention and LoRA dropout 0 (with dropout,
    the copies of a prompt would share one dropout mask)."""
    if setting is not None:
        return setting
    return not uses_varlen(attention, device) and (lora is None or lora.dropout == 0)


def chunk_size(setting: int | None, device: torch.device) -> int:
    """model.logprob_chunk_size, or its default: 2048 tokens on CUDA, 0 (full logits) on the CPU."""
    if setting is not None:
        return setting
    return 2048 if device.type == "cuda" else 0


def set_attention(lm: torch.nn.Module, attention: str, device: torch.device) -> torch.nn.Module:
    """Put `lm` on the varlen attention backend when `attention` says so (see grpokit.common.varlen); a
    vision-language model's text decoder only (its vision tower attends to each image on its own)."""
    if uses_varlen(attention, device):
        use_varlen_text(lm) if is_vision_language(lm.config) else use_varlen(lm)
    return lm


def load_base(
    name: str, dtype: str, quantization: str | None, gradient_checkpointing: bool, device: torch.device
) -> torch.nn.Module:
    """The base model: as stored, or (QLoRA) 4-bit NF4 on the training device, prepared by peft for
    k-bit training."""
    if quantization is None:
        lm = load_causal_lm(name, dtype=parse_dtype(dtype))
        if gradient_checkpointing:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return lm
    from peft import prepare_model_for_kbit_training

    check_nf4(device)  # fails here, with the fix, rather than inside from_pretrained
    lm = load_causal_lm(name, dtype=parse_dtype(dtype), quantization=quantization, device=device)
    return prepare_model_for_kbit_training(
        lm, use_gradient_checkpointing=gradient_checkpointing, gradient_checkpointing_kwargs={"use_reentrant": False}
    )


def compile_layers(lm: torch.nn.Module, activation_memory_budget: float | None) -> None:
    """torch.compile each decoder layer; with a budget, AOTAutograd keeps that fraction of each layer's
    activations for backward and recomputes the cheapest of the rest."""
    if activation_memory_budget is not None:
        import torch._functorch.config as functorch_config

        functorch_config.activation_memory_budget = activation_memory_budget
    compile_decoder_layers(lm)


def shard(lm: torch.nn.Module, mesh, quantization: str | None, compiled: bool) -> None:
    """FSDP2 (trainer.strategy: fsdp2): each decoder layer and the root become FSDP units
    (grpokit.trainer.fsdp); refuses the settings FSDP2 is not checked with."""
    for key, value, why in (
        ("model.quantization", quantization, "4-bit weights cannot be sharded by FSDP2 here"),
        ("model.compile", compiled or None, "compiled layers under FSDP2 are not tested"),
    ):
        if value is not None:
            raise ValueError(
                f"{key}: {value!r} with trainer.strategy fsdp2: {why}; unset {key} or use trainer.strategy: ddp"
            )
    shard_model(lm, mesh)


def check_vision_training(lm: torch.nn.Module, vision: VisionTraining, lora=None) -> VisionTraining | None:
    """model.vision for a vision-language model (None for a text model, where setting it is refused)."""
    if is_vision_language(lm.config):
        if vision.freeze_language_model and lora is not None:
            raise ValueError(
                "model.vision.freeze_language_model with model.lora: the adapter is the language model's; set "
                "model.lora: null to train only the vision parts"
            )
        return vision
    if vision.train or vision.lr is not None:
        raise ValueError(
            f"model.vision {vision} is for vision-language models; {lm.config.model_type} is a text model: unset it"
        )
    return None


def build_model(policy, device: torch.device, mesh=None) -> torch.nn.Module:
    """The Policy's trainable model on its settings (`policy`: a grpokit.trainer.policy.Policy), in
    training mode (from_pretrained returns eval mode; LoRA dropout must be live), sharded over `mesh`
    when given."""
    lm = load_base(policy.model_name, policy.dtype_name, policy.quantization, policy.gradient_checkpointing, device)
    vision = check_vision_training(lm, policy.vision, policy.lora)
    if policy.lora is not None:
        lm = add_lora(lm, policy.lora, policy.gradient_checkpointing, vision_modules(lm, vision) if vision else [])
    elif vision is not None:
        freeze_vision(lm, vision)
    lm = set_attention(lm, policy.attention, device).train()
    if policy.compile_layers:
        compile_layers(lm, policy.activation_memory_budget)
    if mesh is not None:
        shard(lm, mesh, policy.quantization, policy.compile_layers)
    return lm
