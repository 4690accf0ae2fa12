"""The pretraining loop: a VLM's tower learns to tell its pictures' labels.

Only the tower trains, on its own output (the projector runs but is frozen and its output unused; the
language model is not run at all); the LabelHeads (grpokit.pretrain.labels) train beside it and are
dropped at the end. Each step draws
`batch_size` pictures from a seeded shuffle of the training pictures (a new shuffle each pass); every
`eval_interval` steps, and at the last, the held-out pictures (the last `eval_pictures` pairs) are scored.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from PIL import Image

from grpokit.common.io import atomic_folder
from grpokit.pretrain.labels import LabelHeads, Labels, label_accuracy, label_loss, label_targets, label_values
from grpokit.trainer.vision_parts import PROJECTORS, TOWERS, part_of

log = logging.getLogger(__name__)


@dataclass
class PretrainSettings:
    """steps x batch_size pictures at AdamW `lr` (linear warm-up over warmup_steps, then constant);
    the last `eval_pictures` pairs are held out and scored every `eval_interval` steps."""

    steps: int = 800
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 20
    weight_decay: float = 0.01
    eval_pictures: int = 256
    eval_interval: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("steps", "batch_size", "eval_interval"):
            if getattr(self, key) < 1:
                raise ValueError(f"--{key} {getattr(self, key)}: must be at least 1")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"--lr {self.lr}: must be a positive number")


def picture_tokens(model, processor, pictures: list[Image.Image]) -> list[torch.Tensor]:
    """Each picture's tower output, what the projector receives (read by a hook on the projector while
    transformers' `get_image_features` runs): one (patches, hidden) tensor per picture. Idefics3's
    connector gets (tiles, patches, hidden), a picture's tiles in a row (one without image splitting);
    Qwen-VL's merger gets every picture's patches in one (patches, hidden), cut here by `image_grid_thw`."""
    tensors = processor.image_processor(images=[[p] for p in pictures], return_tensors="pt")
    seen: list[torch.Tensor] = []
    handle = projector_module(model).register_forward_hook(lambda module, args, out: seen.append(args[0]))
    try:
        model.model.get_image_features(**tensors)
    finally:
        handle.remove()
    features, pixels, grid = seen[0], tensors["pixel_values"], tensors.get("image_grid_thw")
    if features.dim() == 3 and pixels.dim() == 5:  # Idefics3: a picture's tiles, the all-zero padding ones dropped
        tiles = (pixels != 0).flatten(2).any(-1).sum(1).tolist()
        return [f.flatten(0, 1) for f in features.split(tiles)]
    if features.dim() == 2 and grid is not None:
        return list(features.split(grid.prod(-1).tolist()))
    raise ValueError(f"the projector's input has shape {tuple(features.shape)} for {len(pictures)} pictures: "
                     "grpokit cannot tell each picture's tokens apart for this model family")  # fmt: skip


def projector_module(model) -> torch.nn.Module:
    """The model's projector: its first module named as one (grpokit.trainer.vision_parts.PROJECTORS)."""
    for name, module in model.named_modules():
        if name.split(".")[-1] in PROJECTORS:
            return module
    raise ValueError(f"the model has no module named as a projector {list(PROJECTORS)}: is it a vision-language model?")


def tower_parameters(model) -> list[torch.nn.Parameter]:
    """The tower's parameters, made trainable; the projector's and language model's are frozen (the
    projector learns in SFT, LLaVA's first stage)."""
    params = []
    for name, param in model.named_parameters():
        trains = part_of(name) == "tower"
        param.requires_grad_(trains)
        if trains:
            params.append(param)
    if not params:
        raise ValueError(f"the model has no module named as a tower {list(TOWERS)}: is it a vision-language model?")
    return params


def pretrain_vision(
    model_name: str, pictures: list[Image.Image], labels: list[Labels], out: str | Path, settings: PretrainSettings
) -> dict[str, float]:
    """Pretrain `model_name`'s tower on (picture, labels) pairs; write the whole model and its processor
    to `out` (atomically). Returns the last held-out scores."""
    from transformers import AutoModelForImageTextToText

    from grpokit.common.models import resolve_model
    from grpokit.vision.render import load_processor

    train, held = split_pairs(pictures, labels, settings)
    torch.manual_seed(settings.seed)
    path = resolve_model(model_name)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).train()
    processor = load_processor(path)
    values = label_values(train[1])
    hidden = picture_tokens(model, processor, train[0][:1])[0].shape[-1]
    head = LabelHeads(hidden, values)
    params = tower_parameters(model) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(settings.warmup_steps, 1)))
    targets = label_targets(train[1], values)
    history, order, started = [], torch.empty(0, dtype=torch.long), time.monotonic()
    generator = torch.Generator().manual_seed(settings.seed)
    for step in range(1, settings.steps + 1):
        if len(order) < settings.batch_size:
            order = torch.cat([order, torch.randperm(len(train[0]), generator=generator)])
        batch, order = order[: settings.batch_size], order[settings.batch_size :]
        logits = head(picture_tokens(model, processor, [train[0][i] for i in batch.tolist()]))
        loss = label_loss(logits, targets[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        warmup.step()
        if step % settings.eval_interval == 0 or step == settings.steps:
            row = {"step": step, "loss": loss.item(), **evaluate(model, processor, head, held, values, settings)}
            row["seconds"] = round(time.monotonic() - started, 1)
            history.append(row)
            log.info("pretrain-vision step %d: %s", step, {k: round(v, 4) for k, v in row.items()})
    save_model(model, model_name, out, values, settings, history)
    return history[-1]


def split_pairs(pictures: list, labels: list[Labels], settings: PretrainSettings) -> tuple[tuple, tuple]:
    """(train pairs, held-out pairs), each (pictures, labels); the held-out ones are the last."""
    if len(pictures) != len(labels):
        raise ValueError(f"{len(pictures)} pictures but {len(labels)} labels")
    cut = len(pictures) - settings.eval_pictures
    if cut < settings.batch_size:
        raise ValueError(
            f"{len(pictures)} pictures: fewer than --batch_size {settings.batch_size} are left for training after "
            f"--eval_pictures {settings.eval_pictures}; give the environment more examples (num_tasks)"
        )
    return (pictures[:cut], labels[:cut]), (pictures[cut:], labels[cut:])


@torch.no_grad()
def evaluate(model, processor, head, held: tuple, values: dict, settings: PretrainSettings) -> dict[str, float]:
    """Accuracy per label key and their mean on the held-out pairs (grpokit.pretrain.labels)."""
    if not held[0]:
        return {}
    chunks = [
        head(picture_tokens(model, processor, held[0][i : i + settings.batch_size]))
        for i in range(0, len(held[0]), settings.batch_size)
    ]
    logits = [torch.cat([chunk[k] for chunk in chunks]) for k in range(len(values))]
    accuracy = label_accuracy(logits, label_targets(held[1], values), list(values))
    return {f"eval/accuracy/{k}": v for k, v in accuracy.items()}


def save_model(model, model_name: str, out, values, settings, history) -> None:
    """The model folder (weights in float32, the processor) and pretrain.json (settings, each label's
    values, the scores at each eval), written together."""
    from grpokit.vision.render import save_tokenizer

    with atomic_folder(out) as tmp:
        model.save_pretrained(tmp)
        save_tokenizer(model_name, tmp)
        record = {"base_model": model_name, "settings": asdict(settings), "labels": values, "history": history}
        (tmp / "pretrain.json").write_text(json.dumps(record, indent=1))
