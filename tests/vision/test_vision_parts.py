"""model.vision (grpokit.trainer.vision_parts): the tower and the projector of each tiny family are found by
name, stay frozen by default, and train when the recipe says so: as parameters with full weights, as peft
modules_to_save beside a LoRA adapter, which the builtin engine loads with the adapter (its forward on an
image prompt then equals the trainer's); model.vision.lr is their own parameter group."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from grpokit.common.models import load_causal_lm
from grpokit.envs.shapes import draw_shape
from grpokit.inference.builtin import BuiltinEngine
from grpokit.trainer.lora import LoraSettings, add_lora
from grpokit.trainer.policy import Policy
from grpokit.trainer.publish import weight_update
from grpokit.trainer.vision_parts import VisionTraining, freeze_vision, part_of, vision_modules
from grpokit.vision.render import render_prompt


def trained_parts(lm: torch.nn.Module) -> set[str]:
    return {part_of(n) for n, p in lm.named_parameters() if p.requires_grad}


def test_each_familys_tower_projector_and_text_model_are_found(vl_family):
    _, _, _, model = vl_family
    counts = Counter(part_of(n) for n, _ in model.named_parameters())
    assert counts["tower"] > 0 and counts["projector"] > 0 and counts["text"] > 0, counts


@pytest.mark.parametrize(
    "train, expected",
    [([], {"text"}), (["projector"], {"text", "projector"}), (["projector", "tower"], {"text", "projector", "tower"})],
)
def test_full_weights_train_the_vision_parts_asked_for(vl_family, train, expected):
    _, path, _, _ = vl_family
    lm = load_causal_lm(path)
    freeze_vision(lm, VisionTraining(train))
    assert trained_parts(lm) == expected


def test_freezing_the_language_model_trains_the_vision_parts_alone(vl_family):
    _, path, _, _ = vl_family
    lm = load_causal_lm(path)
    freeze_vision(lm, VisionTraining(["projector", "tower"], freeze_language_model=True))
    assert trained_parts(lm) == {"projector", "tower"}
    policy = Policy(model=path, lora=LoraSettings(), vision=VisionTraining(["projector"], freeze_language_model=True))
    with pytest.raises(ValueError, match="freeze_language_model with model.lora: the adapter is the language model"):
        policy.configure_model()


def test_a_tower_without_its_projector_and_unknown_parts_are_refused():
    with pytest.raises(ValueError, match=r"\[tower\] without its projector.*\[projector, tower\]"):
        VisionTraining(["tower"])
    with pytest.raises(ValueError, match="'encoder'.* are not parts"):
        VisionTraining(["encoder"])
    with pytest.raises(ValueError, match="freeze_language_model with an empty model.vision.train trains nothing"):
        VisionTraining([], freeze_language_model=True)


def test_a_lora_run_trains_the_projector_and_the_engine_samples_with_it(vl_family):
    """LoRA plus model.vision.train [projector]: the adapter and the projector train, the tower does not;
    the update the trainer publishes carries the projector, and BuiltinEngine, loading it, computes the
    trainer's logits for an image prompt (and different ones from the untrained projector's)."""
    _, path, processor, _ = vl_family
    settings, lora = VisionTraining(["projector"]), LoraSettings(rank=4, alpha=8)
    lm = load_causal_lm(path)
    lm = add_lora(lm, lora, False, vision_modules(lm, settings))
    assert trained_parts(lm) == {"text", "projector"}
    with torch.no_grad():
        for name, param in lm.named_parameters():
            if param.requires_grad and part_of(name) == "projector":
                param.add_(0.05 * torch.randn_like(param))
    lm.eval()
    image = draw_shape("square", "green", 56, random.Random(0))
    shaped = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}]
    prompt = render_prompt(processor, shaped, [image])
    ids = torch.tensor([prompt.prompt_ids])
    engine = BuiltinEngine(device="cpu")
    engine.setup(path)
    with torch.no_grad():
        before = engine.model(input_ids=ids, **prompt.vision.tensors).logits
        engine.load_weights(weight_update(lm, lora, 1, {}))
        after = engine.model(input_ids=ids, **prompt.vision.tensors).logits
        trainer = lm(input_ids=ids, **prompt.vision.tensors).logits
    torch.testing.assert_close(after, trainer, atol=1e-5, rtol=1e-5)
    assert (before - trainer).abs().max() > 1e-3


def test_the_vision_lr_is_a_parameter_group_of_its_own(vl_family):
    _, path, _, _ = vl_family
    policy = Policy(model=path, lora=None, lr=1e-4, vision=VisionTraining(["projector", "tower"], lr=1e-2))
    policy.configure_model()
    text_group, vision_group = policy.make_optimizer().param_groups
    names = {id(p): n for n, p in policy.lm.named_parameters()}
    assert text_group["lr"] == 1e-4 and vision_group["lr"] == 1e-2
    assert {part_of(names[id(p)]) for p in vision_group["params"]} == {"projector", "tower"}
    assert {part_of(names[id(p)]) for p in text_group["params"]} == {"text"}


def test_model_vision_on_a_text_model_is_refused(tiny_model):
    policy = Policy(model=tiny_model, vision=VisionTraining(["projector"]))
    with pytest.raises(ValueError, match="model.vision .* is for vision-language models.*unset it"):
        policy.configure_model()
