"""Images in a later turn of a multi-turn rollout (issue 36): a `respond` message with a picture is rendered
by the processor after the conversation so far (the same ids and image inputs as the whole chat rendered at
once), every later turn is sampled with all the conversation's pictures, each rollout with its own, and the
trainer's logprobs are the engine's (token-faithful, both tiny families), in `grpokit fit` too; the image
and environment tokens are never in the loss; an engine that cannot sample them is refused naming the
example."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from grpokit.common.logprobs import packed_token_logprobs
from grpokit.common.models import load_tokenizer
from grpokit.environments import EnvTurn
from grpokit.environments.chat_tokens import ChatTokens
from grpokit.environments.environment import Environment, EnvSpec
from grpokit.environments.image_turns import ImageTurns
from grpokit.envs.shapes import ShapesRetryTask
from grpokit.inference import SamplingSettings
from grpokit.inference.builtin import BuiltinEngine
from grpokit.inference.remote import RemoteEngine
from grpokit.main import main
from grpokit.orchestrator.group_play import generate_rollouts
from grpokit.orchestrator.image_prompts import ImagePrompts
from grpokit.orchestrator.packing import pack
from grpokit.orchestrator.rollouts import TurnLimits
from grpokit.trainer.metrics import mismatch_metrics
from grpokit.vision.images import ImageError, PixelBudget, to_data_url
from grpokit.vision.inputs import prompt_inputs, with_turn
from grpokit.vision.logprobs import image_token_ids
from grpokit.vision.render import render_prompt
from tests.support import read_metrics
from tests.support.servers import serving
from tests.vision.pictures import striped

STOPS = list("aeiou nrst")  # the random model's replies mostly stop within a few tokens


def picture_part(seed: int) -> dict:
    return {"type": "image_url", "image_url": {"url": to_data_url(striped(28, 28, seed))}}


def respond_with_a_picture(self, messages, state):
    """Each reply is shown a picture of its own (seeded by the reply's length): rollouts of one group
    hold different pictures."""
    if state.get("shown"):
        return EnvTurn(done=True, reward=0.0)
    state["shown"] = True
    text = {"type": "text", "text": "Now this one:"}
    return EnvTurn([{"role": "user", "content": [text, picture_part(len(messages[-1]["content"] or ""))]}], reward=0.0)


def test_a_later_turn_renders_as_the_whole_chat_does(vl_family):
    """Prompt + reply + the rendered turn are the whole chat's ids, and the joined image inputs its tensors."""
    _, path, processor, _ = vl_family
    tokenizer = load_tokenizer(path)
    question = [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]
    first = render_prompt(processor, [{"role": "user", "content": question}], [striped(56, 42, 1)])
    reply = tokenizer.encode("It is red", add_special_tokens=False) + tokenizer.encode(
        "<|im_end|>", add_special_tokens=False
    )
    later = [{"role": "user", "content": [{"type": "text", "text": "Now this one:"}, picture_part(2)]}]
    env_ids, vision, count = ImageTurns(tokenizer).render("test", ChatTokens(tokenizer), reply, later, held=1)
    whole_chat = [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "It is red"},
        {"role": "user", "content": [{"type": "text", "text": "Now this one:"}, {"type": "image"}]},
    ]
    whole = render_prompt(processor, whole_chat, [striped(56, 42, 1), striped(28, 28, 2)])
    assert first.prompt_ids + reply + env_ids == whole.prompt_ids
    placeholders = image_token_ids(load_config(path))
    assert any(t in placeholders for t in env_ids) and count == 1
    joined = with_turn(first.vision, vision)
    assert joined.image_dims == whole.vision.image_dims
    for name, tensor in whole.vision.tensors.items():
        assert torch.equal(joined.tensors[name], tensor), name
    assert prompt_inputs(joined) is first.vision and prompt_inputs(first.vision) is first.vision
    assert prompt_inputs(with_turn(None, vision)) is None  # a text first prompt: an expert gets no images


def test_a_later_turns_images_are_held_to_the_budget_and_a_text_only_policy_is_refused(vl_family, tiny_model):
    _, path, _, _ = vl_family
    tokenizer = load_tokenizer(path)
    later = [{"role": "user", "content": [picture_part(2), picture_part(3)]}]
    turns = ImageTurns(tokenizer, PixelBudget(max_images=2))
    with pytest.raises(ImageError, match=r"^env 'e' example 0: a later turn brings the conversation to 3 images, "):
        turns.render("env 'e' example 0", ChatTokens(tokenizer), [], later, held=1)
    text = load_tokenizer(tiny_model)
    with pytest.raises(ValueError, match=r"env 'e' example 0: respond\(\) returned a message with images; the "
                       r"conversation has images, but the policy .* is a text-only model"):  # fmt: skip
        ImageTurns(text).render("env 'e' example 0", ChatTokens(text), [], later, held=0)


def load_config(path: str):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


def play(path: str, monkeypatch, engine=None):
    """Four prompts of `shapes` (tries 2) x 3 rollouts, each reply answered with a picture of its own."""
    monkeypatch.setattr(ShapesRetryTask, "respond", respond_with_a_picture)
    return two_turns(path, Environment(EnvSpec("shapes", {"num_tasks": 4, "tries": 2})), engine)


def two_turns(path: str, env: Environment, engine=None):
    """(the engine, the rollouts): the environment's prompts x 3 rollouts of two turns at most, sampled by
    `engine` (a BuiltinEngine on its plain path when None) at temperature 1."""
    tokenizer = load_tokenizer(path)
    prompts, ids, vision = ImagePrompts.for_envs(tokenizer, [env]).render_all([(env, ex) for ex in env.examples])
    if engine is None:
        engine = BuiltinEngine(fast="off")
        engine.setup(path)
    sampling = SamplingSettings(temperature=1.0, max_tokens=6, seed=3, stop=STOPS)
    groups = generate_rollouts(engine, tokenizer, prompts, 3, sampling, 0, ids, TurnLimits(2, 1024), vision)
    return engine, [r for group in groups for r in group]


def test_later_turn_images_are_sampled_and_scored_faithfully_with_a_mask_on_replies_only(vl_family, monkeypatch):
    _, path, _, _ = vl_family
    engine, rollouts = play(path, monkeypatch)
    placeholders = image_token_ids(engine.model.config)
    shown = [r for r in rollouts if "Now this one:" in r.completion_text]
    assert len(shown) >= len(rollouts) // 2, [r.completion_text for r in rollouts]
    tokenizer = load_tokenizer(path)
    for r in rollouts:
        images = [t in placeholders for t in r.prompt_ids + r.completion_ids]
        runs = sum(1 for i, flag in enumerate(images) if flag and (i == 0 or not images[i - 1]))
        assert runs >= (2 if r in shown else 1)  # Idefics3: a run per tile
        grids = r.vision.tensors.get("image_grid_thw")
        assert grids is None or grids.shape[0] == (2 if r in shown else 1)  # Qwen2.5-VL: a grid per image
        # the environment's tokens (its text, the picture's placeholders) are never in the loss
        assert not any(m and t in placeholders for t, m in zip(r.completion_ids, r.completion_mask))
        trained = tokenizer.decode([t for t, m in zip(r.completion_ids, r.completion_mask) if m])
        assert "Now this one" not in trained and "user" not in trained
        assert 0 in r.completion_mask if r in shown else True
    pixels = [r.vision.tensors["pixel_values"] for r in shown]
    assert any(not torch.equal(pixels[0], p) for p in pixels[1:])  # each rollout its own picture
    error = mismatch(engine, rollouts)
    print(f"BuiltinEngine, later-turn images: token_mult_prob_error {error:.9f}")
    assert abs(error - 1) < 1e-4
    error = mismatch(engine, swapped_within_groups(groups_of(shown)))  # each scored with another's later picture
    print("scored with another rollout's later picture:", error)
    assert abs(error - 1) > 1e-3  # so the check above sees each rollout's own picture


def groups_of(rollouts: list) -> list[list]:
    """`rollouts` by group (the same prompt and first picture), in group id order."""
    return [[r for r in rollouts if r.group_id == g] for g in sorted({r.group_id for r in rollouts})]


def swapped_within_groups(groups) -> list:
    """Each rollout with the image inputs of the next in its group (rotated): scored so, the engine's logprobs
    must disagree, which shows a faithfulness check saw each rollout's own later picture."""
    swapped = []
    for mine in groups:
        swapped += [replace(r, vision=other.vision) for r, other in zip(mine, mine[1:] + mine[:1])]
    return swapped


def mismatch(engine, rollouts) -> float:
    """The trainer's token_mult_prob_error over `rollouts`, packed into micro-batches as for training."""
    advantages = [[1.0] * len(r.completion_ids) for r in rollouts]
    trainer, engine_lp, mask = [], [], []
    for mb in pack(rollouts, advantages, [True] * len(rollouts), 4096):
        with torch.no_grad():
            trainer.append(
                packed_token_logprobs(
                    engine.model, mb.input_ids_T, mb.position_ids_T, mb.seq_lens_N, 1.0, vision=mb.vision
                )
            )
        engine_lp.append(mb.inference_logprobs_T)
        mask.append(mb.loss_mask_T)
    metrics = mismatch_metrics(torch.cat(trainer), torch.cat(engine_lp), torch.cat(mask))
    return float(metrics["token_mult_prob_error"])


def test_a_text_first_prompt_may_be_followed_by_a_picture(vl_family, monkeypatch):
    """reverse_text (a text prompt) answered with a picture: the first turn is sampled on the text path,
    the second on the image path, and the trainer scores the whole sequence as the engine sampled it."""
    from grpokit.envs.reverse_text import ReverseTextTask

    _, path, _, _ = vl_family
    monkeypatch.setattr(ReverseTextTask, "respond", respond_with_a_picture, raising=False)
    env = Environment(EnvSpec("reverse_text", {"num_tasks": 2}))
    engine = BuiltinEngine(fast="off")
    engine.setup(path)
    sampling = SamplingSettings(temperature=1.0, max_tokens=6, seed=3, stop=STOPS)
    prompts = [(env, ex) for ex in env.examples]
    rollouts = [
        r for g in generate_rollouts(engine, engine.tokenizer, prompts, 3, sampling, 0, None, TurnLimits(2)) for r in g
    ]
    shown = [r for r in rollouts if "Now this one:" in r.completion_text]
    assert shown and all(r.vision is not None for r in shown)
    assert all(r.vision is None for r in rollouts if r not in shown)
    error = mismatch(engine, rollouts)
    print(f"text first prompt, then a picture: token_mult_prob_error {error:.9f}")
    assert abs(error - 1) < 1e-4


def test_remote_engine_sends_later_turn_images_to_grpokit_infer(vl_family, monkeypatch):
    """RemoteEngine in front of `grpokit infer`: each turn's request carries the conversation's image inputs
    so far, and the server's logprobs are the trainer's."""
    family, path, _, _ = vl_family
    with serving(path) as (engine, server):
        remote = RemoteEngine(base_url=server.url, model_name="tiny", max_retries=0)
        remote.setup(path)
        _, rollouts = play(path, monkeypatch, remote)
    assert sum("Now this one:" in r.completion_text for r in rollouts) >= len(rollouts) // 2
    error = mismatch(engine, rollouts)
    print(f"{family}: RemoteEngine, later-turn images: token_mult_prob_error {error:.9f}")
    assert abs(error - 1) < 1e-4


class NoLaterImages(BuiltinEngine):
    later_turn_images = False  # refused at the turn, as BuiltinEngine's fast path is (its stream takes no images)


def refused_at_the_turn(path: str, play, monkeypatch, refusal: str) -> None:
    """`play` (a two-turn game whose later turn brings a picture) on NoLaterImages stops with `refusal`."""
    engine = NoLaterImages(fast="off")
    engine.setup(path)
    with pytest.raises(ValueError, match=refusal):
        play(path, monkeypatch, engine)


def test_an_engine_that_cannot_sample_later_images_is_refused_naming_the_example(vl_family, monkeypatch):
    refusal = (
        r"environment 'shapes' example \d+: respond\(\) returned a message with images, which NoLaterImages "
        r"cannot sample in a later turn yet: use inference BuiltinEngine"
    )
    refused_at_the_turn(vl_family[1], play, monkeypatch, refusal)


def fit_argv(tmp_path, model: str, name: str) -> list[str]:
    env = [{"id": "shapes", "args": {"num_tasks": 16, "tries": 2}}]
    return [
        *fit_base(tmp_path, model, name, env),
        "--data.sampling.stop", json.dumps(STOPS),
    ]  # fmt: skip


def fit_base(tmp_path, model: str, name: str, env: list) -> list[str]:
    from grpokit.testing import tiny_fit_argv

    return tiny_fit_argv(
        tmp_path, model, name, "--data.env", json.dumps(env), "--data.eval", "null",
        "--data.max_async_level", "0", "--data.seq_len", "512", "--trainer.max_steps", "2",
    )  # fmt: skip


def fit_faithfully(argv: list[str], run_dir) -> list[dict]:
    """Run a 2-step fit; its metrics rows, each step's token_mult_prob_error checked within 1e-4 of 1."""
    assert main(argv) == 0
    rows = read_metrics(run_dir)
    assert [int(r["step"]) for r in rows] == [0, 1]
    for r in rows:
        assert abs(float(r["token_mult_prob_error"]) - 1) < 1e-4, r
    return rows


def test_fit_trains_on_later_turn_images_token_faithfully(vl_family, tmp_path, monkeypatch):
    family, path, _, _ = vl_family
    monkeypatch.setattr(ShapesRetryTask, "respond", respond_with_a_picture)
    rows = fit_faithfully(fit_argv(tmp_path, path, family), tmp_path / family)
    samples = [json.loads(line) for line in open(tmp_path / family / "samples.jsonl")]
    assert sum("Now this one:" in s["completion"] for s in samples) >= len(samples) // 2, samples[:4]
    print(family, [r["token_mult_prob_error"] for r in rows])
