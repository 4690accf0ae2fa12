"""SFT with images (issue 36): chats whose messages hold pictures are rendered with the model's processor as
a rollout's image prompt is, trained by `grpokit sft` on each tiny family, and the SFT run starts a
`grpokit fit` on image prompts whose step 0 is token-faithful; Chord's expert sequences carry the
picture they answer."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from safetensors.torch import load_file

from grpokit.common.models import load_tokenizer
from grpokit.envs.shapes import draw_shape
from grpokit.main import main
from grpokit.sft.render import ChatRenderer
from grpokit.testing import tiny_fit_argv
from grpokit.trainer.vision_parts import part_of
from grpokit.vision.images import to_data_url
from grpokit.vision.messages import prompt_images
from grpokit.vision.render import render_prompt
from tests.support import read_metrics


def picture(seed: int, colour: str = "red"):
    return draw_shape("circle", colour, 56, random.Random(seed))


def image_part(image) -> dict:
    return {"type": "image_url", "image_url": {"url": to_data_url(image)}}


def two_turn_chat() -> list[dict]:
    """A user turn with a picture, an answer, a second picture, a second answer."""
    return [
        {"role": "user", "content": [image_part(picture(0)), {"type": "text", "text": "What colour?"}]},
        {"role": "assistant", "content": "red"},
        {"role": "user", "content": [{"type": "text", "text": "And now?"}, image_part(picture(1, "blue"))]},
        {"role": "assistant", "content": "blue"},
    ]


def test_a_chat_with_pictures_is_rendered_as_a_rollouts_image_prompt(vl_family):
    """The sequence is the processor's render of the whole chat; each assistant turn's tokens follow exactly
    what its prompt renders to as a rollout's image prompt (render_prompt); the mask is those tokens through
    EOS and never an image placeholder; the image inputs are the whole chat's, both pictures."""
    family, path, processor, _ = vl_family
    tokenizer = load_tokenizer(path)
    chat = two_turn_chat()
    rendered = ChatRenderer(tokenizer).render(chat, where="test example 0")
    shaped, images = prompt_images(chat)
    whole = render_prompt(processor, shaped, images, add_generation_prompt=False)
    assert rendered.input_ids == whole.prompt_ids
    for name, tensor in whole.vision.tensors.items():
        assert torch.equal(rendered.vision.tensors[name], tensor), name
    first = render_prompt(processor, shaped[:1], images[:1]).prompt_ids  # the first turn's prompt, as a rollout's
    second = render_prompt(processor, shaped[:3], images).prompt_ids
    assert rendered.input_ids[: len(first)] == first and rendered.input_ids[: len(second)] == second
    marked = [i for i, m in enumerate(rendered.loss_mask) if m]
    eos = tokenizer.eos_token_id
    first_end = rendered.input_ids.index(eos, len(first)) + 1
    second_end = rendered.input_ids.index(eos, len(second)) + 1
    assert marked == [*range(len(first), first_end), *range(len(second), second_end)]
    assert tokenizer.decode([rendered.input_ids[i] for i in marked]).replace(tokenizer.eos_token, "|") == "red|blue|"
    image_ids = {tokenizer.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<image>")} - {None}
    assert not any(rendered.input_ids[i] in image_ids for i in marked)
    assert sum(i in image_ids for i in rendered.input_ids) > 0


def test_a_chat_with_pictures_is_refused_a_text_only_model(tiny_model):
    with pytest.raises(ValueError, match=r"data.path 'x.jsonl' example 3 has images, but the policy .* text-only"):
        ChatRenderer(load_tokenizer(tiny_model)).render(two_turn_chat(), where="data.path 'x.jsonl' example 3")


def shapes_sft_argv(tmp_path, model: str, name: str, *extra: str) -> list[str]:
    """`grpokit sft` on the shapes environment's own answers: 24 pictures, 8 per step, 4 held out."""
    env = [{"id": "shapes", "args": {"num_tasks": 24, "question": "mixed"}}]
    return [
        "sft", "--output_dir", str(tmp_path), "--run_name", name, "--model.model", model,
        "--model.lora", "null", "--model.loss", "NLL", "--model.lr", "3e-3", "--model.warmup_steps", "0",
        "--data.env", json.dumps(env), "--data.batch_size", "8", "--data.seq_len", "512",
        "--data.eval_fraction", "0.17", "--data.eval_interval", "3", "--trainer.max_steps", "6",
        "--model.vision", "{train: [projector, tower], lr: 1e-2}",
        "--trainer.enable_progress_bar", "false", "--num_threads", "1", "--seed_everything", "0", *extra,
    ]  # fmt: skip


def test_sft_on_pictures_learns_and_grpo_starts_from_it_token_faithful(vl_family, tmp_path):
    """`grpokit sft` with data.env shapes on each tiny family: full weights, the vision tower and projector
    included (model.vision), the held-out loss (scored with the pictures) falls, and the saved model holds
    the trained tower and the processor; then `grpokit fit --model.init_from` the SFT run, with LoRA and the
    projector training beside it, samples image prompts with the SFT weights, evaluates them (data.eval),
    and its steps 0 and 1 (sampled after the adapter and projector were published) are token-faithful."""
    family, path, _, _ = vl_family
    assert main(shapes_sft_argv(tmp_path, path, f"{family}-sft")) == 0
    run = tmp_path / f"{family}-sft"
    base, trained = load_file(f"{path}/model.safetensors"), load_file(run / "model" / "model.safetensors")
    tower = [n for n in base if part_of(n) == "tower" and base[n].is_floating_point()]
    assert tower and all(not torch.equal(base[n], trained[n]) for n in tower if n.endswith(".weight"))
    assert (run / "model" / "processor_config.json").is_file()  # with the image processor
    rows = read_metrics(run)
    assert [int(r["step"]) for r in rows] == list(range(6))
    assert all(math.isfinite(float(r["loss"])) and float(r["loss_tokens"]) > 0 for r in rows)
    evals = read_metrics(run, "eval_loss")
    assert [int(r["step"]) for r in evals] == [0, 3, 6]
    assert float(evals[-1]["eval_loss"]) < float(evals[0]["eval_loss"]) - 1.0, evals

    env = [{"id": "shapes", "args": {"num_tasks": 16, "question": "mixed"}}]
    argv = tiny_fit_argv(
        tmp_path, path, f"{family}-grpo", "--data.env", json.dumps(env), "--data.max_async_level", "0",
        "--data.seq_len", "256", "--trainer.max_steps", "2", "--model.init_from", str(run),
        "--data.eval", json.dumps({"num_examples": 4, "interval": 1}), "--model.vision", "{train: [projector]}",
    )  # fmt: skip
    assert main(argv) == 0
    rows = read_metrics(tmp_path / f"{family}-grpo")
    assert [int(r["step"]) for r in rows] == [0, 1]
    assert all(abs(float(r["token_mult_prob_error"]) - 1) < 1e-4 for r in rows), rows
    evaluated = [json.loads(line) for line in open(tmp_path / f"{family}-grpo" / "eval.jsonl")]
    assert [e["eval/weight_step"] for e in evaluated] == [0, 1] and all(0 <= e["eval/reward"] <= 1 for e in evaluated)
