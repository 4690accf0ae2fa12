"""`model.vision`: which parts of a vision-language model train beside its language model, and how fast.

A vision-language model is a vision tower (the image encoder), a projector (the connector that maps the
tower's features into the text model's embedding space) and a language model. By default only the
language model trains (LoRA on its decoder, or all of its weights with `model.lora: null`), the tower and
the projector frozen, as TRL, verl and ms-swift do by default (ms-swift's freeze_vit / freeze_aligner).

`train: [projector]` trains the projector too, `[projector, tower]` both (a tower never trains without
its projector, which reads its features). `freeze_language_model: true` trains those alone (LLaVA's first
stage, ms-swift's freeze_llm): a random tower and projector learn to speak to the language model instead
of the language model learning to answer without looking (its answer priors come first otherwise, and
starve the vision parts of gradient; docs/results.md). With full weights their parameters train; with LoRA they are
peft's `modules_to_save` (a trained copy beside the adapter, saved and sent to the engine with it;
BuiltinEngine loads it, vLLM's LoRA cannot: VLLMEngine refuses it). `lr` is their learning rate, a
second AdamW parameter group (null: model.lr): a tower trained from scratch wants a larger rate than a
pretrained language model.

The parts are found by the module names transformers gives them: the tower `vision_model` (Idefics3,
SmolVLM), `visual` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) or `vision_tower` (LLaVA, Gemma 3); the projector
`connector`, `visual.merger` or `multi_modal_projector`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from grpokit.common.models import VISION_PROJECTORS as PROJECTORS
from grpokit.common.models import VISION_TOWERS as TOWERS


@dataclass
class VisionTraining:
    """model.vision: the vision parts that train (projector, tower) and their learning rate.

    Args:
        train: besides the language model: [] (both frozen, the default), [projector], or
            [projector, tower].
        lr: the learning rate of the vision parts that train (null: model.lr).
        freeze_language_model: only the parts in `train` train (full weights, model.lora: null).
    """

    train: list[Literal["projector", "tower"]] = field(default_factory=list)
    lr: float | None = None
    freeze_language_model: bool = False

    def __post_init__(self) -> None:
        unknown = sorted(set(self.train) - {"projector", "tower"})
        if unknown:
            raise ValueError(f"model.vision.train: {unknown} are not parts; use [], [projector] or [projector, tower]")
        if "tower" in self.train and "projector" not in self.train:
            raise ValueError(
                "model.vision.train: [tower] without its projector, which reads the tower's features: use "
                "[projector, tower]"
            )
        if self.freeze_language_model and not self.train:
            raise ValueError("model.vision.freeze_language_model with an empty model.vision.train trains nothing")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"model.vision.lr must be > 0 (or null for model.lr), got {self.lr}")


def part_of(name: str) -> str:
    """'projector', 'tower' or 'text' for a parameter or module name (a projector inside the tower, as
    Qwen-VL's visual.merger, is the projector)."""
    parts = name.split(".")
    if any(p in PROJECTORS for p in parts):
        return "projector"
    if any(p in TOWERS for p in parts):
        return "tower"
    return "text"


def vision_modules(lm: torch.nn.Module, settings: VisionTraining) -> list[str]:
    """The module names (last components) of the parts `settings` trains, for peft's modules_to_save:
    with `tower`, the tower's module and a projector outside it (Idefics3's connector; Qwen-VL's merger is
    inside its tower); with `projector` alone, the projector's module."""
    if not settings.train:
        return []
    # each module: (its name's last component, whether it sits inside a tower)
    named = [(n.split(".")[-1], any(p in TOWERS for p in n.split(".")[:-1])) for n, _ in lm.named_modules() if n]
    towers = {last for last, inside in named if last in TOWERS and not inside}
    if "tower" in settings.train:
        found = towers | {last for last, inside in named if last in PROJECTORS and not inside}
    else:
        found = {last for last, _ in named if last in PROJECTORS}
    if not found or ("tower" in settings.train and not towers):
        raise ValueError(
            f"model.vision.train {settings.train}: the model has no module named as a tower {list(TOWERS)} or "
            f"projector {list(PROJECTORS)}; grpokit finds a vision-language model's parts by transformers' names "
            "(grpokit.trainer.vision_parts)"
        )
    return sorted(found)


def freeze_vision(lm: torch.nn.Module, settings: VisionTraining) -> None:
    """Full weights: the tower's and projector's parameters train only if `settings` says so, the language
    model's unless it is frozen."""
    for name, param in lm.named_parameters():
        part = part_of(name)
        if part == "text":
            param.requires_grad_(not settings.freeze_language_model)
        else:
            param.requires_grad_(part in settings.train)


def vision_parameter_names(lm: torch.nn.Module) -> set[str]:
    """The trainable parameters of the tower and projector (model.vision.lr's parameter group)."""
    return {n for n, p in lm.named_parameters() if p.requires_grad and part_of(n) != "text"}
