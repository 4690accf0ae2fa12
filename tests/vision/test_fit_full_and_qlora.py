"""`grpokit fit` with image prompts under full fine-tuning (`model.lora: null`) and QLoRA (`model.quantization:
nf4` with a LoRA), on both tiny families, builtin engine, max_async_level 0 (issue 36: "QLoRA and full
fine-tuning as for text")."""

from __future__ import annotations

import pytest

from grpokit.main import main
from grpokit.trainer.vision_parts import part_of
from tests.support import read_metrics
from tests.vision.test_fit_images import image_fit_argv

# QLoRA: the engine samples with the unquantized float32 base plus the adapter (as for text, docs/qerl-qlora.md),
# the trainer scores with the NF4 base, so token_mult_prob_error is NF4's rounding of the language model's
# weights, not float32's 1e-7. Measured per step: Qwen2.5-VL 1.0088, 1.0075; Idefics3 1.0109, 1.0110 (the same
# with float32 compute instead of bf16: the weights' rounding, not the compute). 0.05 is ~4.5x the largest;
# a mismatch of inputs (a forward without the pictures) gives errors far beyond it.
QLORA_BOUND = 0.05


@pytest.fixture
def varied_reward(monkeypatch):
    """Odd-length replies score 1 (the random tiny models never name a colour): rewards vary within groups,
    so step 0 has a non-zero gradient."""
    import verifiers.v1 as vf

    from grpokit.envs.shapes import ShapesTask

    @vf.reward(weight=1.0)
    async def correct(self, trace) -> float:
        return float(len(trace.last_reply or "") % 2)

    monkeypatch.setattr(ShapesTask, "correct", correct)


def fit_rows(tmp_path, path: str, name: str, *extra: str) -> list[dict]:
    assert main(image_fit_argv(tmp_path, path, name, "--model.lr", "1e-2", *extra)) == 0
    rows = read_metrics(tmp_path / name)
    assert [int(r["step"]) for r in rows] == [0, 1]
    errors = [float(r["token_mult_prob_error"]) for r in rows]
    print(f"{name}: token_mult_prob_error per step {errors}, step 0 grad_norm {rows[0]['grad_norm']}")
    assert float(rows[0]["grad_norm"]) > 0 and float(rows[0]["reward_std"]) > 0
    return rows


def test_full_fine_tuning_on_image_prompts_trains_the_language_model_with_the_tower_frozen(
    vl_family, tmp_path, varied_reward
):
    """model.lora: null: step 0 updates the language model's weights, which the engine receives (step 1's
    broadcast differs from step 0's) and samples step 1 with, token-faithful in float32 at every step; the
    vision tower and projector (model.vision.train: [], the default) are sent unchanged."""
    from safetensors.torch import load_file

    family, path, _, _ = vl_family
    rows = fit_rows(tmp_path, path, family, "--model.lora", "null")
    for r in rows:
        assert abs(float(r["token_mult_prob_error"]) - 1) < 1e-4, r["step"]
    sent = [load_file(tmp_path / family / "broadcasts" / f"step_{s}" / "model.safetensors") for s in (0, 1)]
    assert sent[0].keys() == sent[1].keys()
    changed = {part_of(k) for k in sent[0] if not (sent[0][k] == sent[1][k]).all()}
    assert changed == {"text"}, changed
    assert {part_of(k) for k in sent[0]} == {"text", "tower", "projector"}  # the parts were sent, unchanged


def quantized_parts(path: str) -> dict[str, set[bool]]:
    """For each part of the model loaded as the trainer loads it for QLoRA: whether its linear layers are 4-bit."""
    import bitsandbytes as bnb
    import torch

    from grpokit.common.models import load_causal_lm

    lm = load_causal_lm(path, quantization="nf4")
    found: dict[str, set[bool]] = {}
    for name, module in lm.named_modules():
        if isinstance(module, torch.nn.Linear):
            kind = "head" if name.endswith("lm_head") else part_of(name)
            found.setdefault(kind, set()).add(isinstance(module, bnb.nn.Linear4bit))
    return found


def test_qlora_on_image_prompts_quantizes_the_language_model_only(vl_family, tmp_path, varied_reward):
    """model.quantization: nf4 with LoRA: the language model's linear layers are 4-bit, the head, the vision
    tower and the projector stay in the run's dtype (as TRL, ms-swift and Unsloth keep them); the run trains
    (step 0's gradient reaches the adapter, step 1 samples with it) and every step's token_mult_prob_error is
    the NF4 rounding's (QLORA_BOUND)."""
    pytest.importorskip("bitsandbytes")
    family, path, _, _ = vl_family
    assert quantized_parts(path) == {"text": {True}, "head": {False}, "tower": {False}, "projector": {False}}
    rows = fit_rows(tmp_path, path, family, "--model.quantization", "nf4")
    for r in rows:
        assert abs(float(r["token_mult_prob_error"]) - 1) < QLORA_BOUND, r["step"]
    assert "step_1" in {p.name for p in (tmp_path / family / "broadcasts").glob("step_*")}
