"""LoRA for the Policy: the adapter's settings, wrapping the base model in peft, and the adapter as the
tensors and config a WeightUpdate carries to the engine."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

import torch

from grpokit.common.models import is_vision_language
from grpokit.trainer.fsdp import full_tensors


@dataclass
class LoraSettings:
    """peft LoRA adapter settings.

    Args:
        rank: adapter rank r.
        alpha: scaling numerator (the update is alpha / r * B A).
        dropout: dropout on the adapter input.
        target_modules: module names to adapt.
    """

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(
                f"model.lora.rank must be >= 1, got {self.rank} (set model.lora: null to train all weights)"
            )
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(
                f"model.lora.alpha must be a finite number > 0 (the update is alpha / rank * B A), got {self.alpha}"
            )
        if not 0 <= self.dropout < 1:
            raise ValueError(f"model.lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ValueError("model.lora.target_modules is empty: name the modules to adapt, e.g. [q_proj, v_proj]")


def add_lora(
    lm: torch.nn.Module, settings: LoraSettings, gradient_checkpointing: bool, modules_to_save: list[str] = ()
) -> torch.nn.Module:
    """`lm` wrapped in a peft LoRA adapter (a causal-LM task); with checkpointing, the embedding's output
    requires grad so that checkpointed layers under frozen weights still backpropagate into the adapter.
    A vision-language model's adapter is on its text decoder only (`lora_targets`); `modules_to_save` (its
    projector or tower, model.vision.train: grpokit.trainer.vision_parts) train in full beside it."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=lora_targets(lm, list(settings.target_modules)),
        task_type="CAUSAL_LM",
        modules_to_save=list(modules_to_save) or None,
    )
    check_target_modules(lm, settings.target_modules)
    lm = get_peft_model(lm, config)
    if gradient_checkpointing:
        lm.enable_input_require_grads()
    return lm


def lora_targets(lm: torch.nn.Module, targets: list[str]) -> list[str] | str:
    """What peft adapts: the `targets` names anywhere in a causal LM; in a vision-language model, only those
    inside its text decoder (a regex peft matches against whole module paths), so the vision tower (whose
    attention also has q_proj/k_proj/v_proj in SigLIP-style towers) and the projector stay frozen."""
    if not is_vision_language(lm.config):
        return targets
    decoder = lm.get_decoder()
    prefix = next(name for name, module in lm.named_modules() if module is decoder)
    return rf"{re.escape(prefix)}\..*\.({'|'.join(re.escape(t) for t in targets)})"


def check_target_modules(lm: torch.nn.Module, targets: list[str]) -> None:
    """Every model.lora.target_modules name is the last part of some module path of the model (how peft
    matches a list entry): a misspelt one is named with the layer names the model has, instead of peft's
    error, or, when the other names match, a silently smaller adapter."""
    names = {name.rsplit(".", 1)[-1] for name, _ in lm.named_modules() if name}
    missing = [t for t in targets if t not in names]
    if missing:
        leaves = sorted({name.rsplit(".", 1)[-1] for name, m in lm.named_modules() if name and not any(m.children())})
        raise ValueError(
            f"model.lora.target_modules {missing}: the model has no module of that name; its layers are {leaves}"
        )


def adapter_tensors(lm: torch.nn.Module, sharded: bool) -> tuple[dict[str, torch.Tensor], dict]:
    """The adapter's weights (peft's state-dict names, detached copies) and its LoraConfig as plain JSON
    values. Sharded (FSDP2), every rank must call it: the adapter's shards are gathered on every rank."""
    from peft import get_peft_model_state_dict

    config = lm.peft_config["default"]
    config_dict = json.loads(
        json.dumps(config.to_dict(), default=lambda o: sorted(o) if isinstance(o, set) else str(o))
    )
    adapter = full_tensors({n: p.detach() for n, p in lm.named_parameters() if p.requires_grad}) if sharded else None
    tensors = {k: v.detach().clone() for k, v in get_peft_model_state_dict(lm, state_dict=adapter).items()}
    return tensors, config_dict
