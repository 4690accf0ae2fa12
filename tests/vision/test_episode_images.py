"""A verifiers Env episode whose task's prompt holds a picture (issue 36): the role's prompt is rendered by
the processor as the driver renders a first prompt with images, every reply of the episode is sampled with
the picture, and the trained role's rollout is token-faithful on both tiny families (in `grpokit fit` too);
no image token is trained on; a text-only policy is refused at start naming the environment. A later
`turn()` message with a picture (after a picture prompt or a text one) is rendered as a suffix after the
engine's tokens, each later reply sampled and scored with every picture so far, token-faithful; a text-only
policy, an unreadable picture, one over max_images, and an engine that cannot sample later-turn pictures are
refused naming the environment, example (and role)."""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace

import pytest
import torch

from grpokit.common.models import load_tokenizer
from grpokit.environments.environment import Environment, EnvSpec
from grpokit.inference import SamplingSettings
from grpokit.inference.builtin import BuiltinEngine
from grpokit.inference.remote import RemoteEngine
from grpokit.orchestrator.group_play import generate_rollouts
from grpokit.orchestrator.image_prompts import ImagePrompts
from grpokit.orchestrator.prompt_length import prompt_token_ids
from grpokit.orchestrator.rollouts import TurnLimits
from grpokit.vision.images import PixelBudget
from grpokit.vision.logprobs import image_token_ids
from tests.support.servers import serving
from tests.vision.test_later_turn_images import (
    STOPS,
    fit_base,
    fit_faithfully,
    mismatch,
    refused_at_the_turn,
    swapped_within_groups,
)

# An Env of its own over the shapes taskset: the player answers the task's prompt (its picture and question),
# then is asked again in text; the picture stays in the player's conversation.
LOOK_AGAIN = """
import verifiers.v1 as vf


class LookAgainConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(max_turns=2)


class LookAgain(vf.Env[LookAgainConfig]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as player:
            segment = await player.turn()
            if not segment.terminated:
                await player.turn("Look again: what colour is it?")


__all__ = ["LookAgain", "LookAgainConfig"]
"""
ENV_ID = "look-again+shapes"


@pytest.fixture
def look_again(tmp_path, monkeypatch):
    (tmp_path / "look_again.py").write_text(textwrap.dedent(LOOK_AGAIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    return Environment(EnvSpec(id=ENV_ID, args={"num_tasks": 3}))


def test_an_episode_whose_prompt_holds_a_picture_is_sampled_and_scored_faithfully(vl_family, look_again):
    family, path, _, _ = vl_family
    env = look_again
    assert env.episode_env is not None
    tokenizer = load_tokenizer(path)
    prompts, ids, vision = ImagePrompts.for_envs(tokenizer, [env]).render_all([(env, ex) for ex in env.examples])
    engine = BuiltinEngine(fast="off")
    engine.setup(path)
    sampling = SamplingSettings(temperature=1.0, max_tokens=6, seed=3, stop=STOPS)
    groups = generate_rollouts(engine, tokenizer, prompts, 3, sampling, 0, ids, TurnLimits(4, 1024), vision)
    placeholders = image_token_ids(engine.model.config)
    rollouts = [r for group in groups for r in group]
    for group, prompt_ids in zip(groups, ids):
        for r in group:
            assert r.prompt_ids == prompt_ids  # the episode renders the role's prompt as the driver does
            assert r.vision is not None and any(t in placeholders for t in r.prompt_ids)
            assert not any(m and t in placeholders for t, m in zip(r.completion_ids, r.completion_mask))
            assert r.messages[0]["content"][0]["type"] == "image_url"  # the trace keeps the picture's part
    asked_again = [r for r in rollouts if "Look again" in r.completion_text]
    assert len(asked_again) >= len(rollouts) // 2, [r.completion_text for r in rollouts]
    json.dumps([r.messages for r in rollouts])
    error = mismatch(engine, rollouts)
    print(f"{family}: Env episode with a picture: token_mult_prob_error {error:.9f}")
    assert abs(error - 1) < 1e-4
    swapped = [replace(r, vision=other[0].vision) for g, other in zip(groups, groups[1:] + groups[:1]) for r in g]
    error = mismatch(engine, swapped)
    print(f"{family}: scored with another example's picture: {error:.6f}")
    assert abs(error - 1) > 1e-3  # so the check above sees each episode's own picture


def test_a_text_only_policy_is_refused_an_episode_with_pictures(look_again, tiny_model):
    with pytest.raises(ValueError, match=r"environment 'look-again\+shapes' \(example 0\) has images, but the policy"):
        ImagePrompts.for_envs(load_tokenizer(tiny_model), [look_again])


def test_fit_trains_on_an_episode_with_pictures_token_faithfully(vl_family, look_again, tmp_path):
    family, path, _, _ = vl_family
    env = [{"id": ENV_ID, "args": {"num_tasks": 16}}]
    argv = [*fit_base(tmp_path, path, family, env), "--data.sampling.stop", json.dumps(STOPS), "--data.max_turns", "2"]
    rows = fit_faithfully(argv, tmp_path / family)
    print(family, "Env episode with pictures, fit:", [r["token_mult_prob_error"] for r in rows])


# An Env whose run shows the player a second picture in a later turn(): a shape drawn from its first reply
# (so rollouts of a group see different pictures), as an `image` part holding a PIL image; with
# `picture: unreadable`, an OpenAI `image_url` part (a verifiers UserMessage) whose data: URL is no picture.
SHOW_ANOTHER = """
import random
import zlib

import verifiers.v1 as vf

from grpokit.envs.shapes import COLOURS, SHAPES, draw_shape


class ShowAnotherConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(max_turns=2)
    picture: str = "shape"


class ShowAnother(vf.Env[ShowAnotherConfig]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as player:
            segment = await player.turn()
            if segment.terminated:
                return
            text = {"type": "text", "text": "Now this one: which shape is it?"}
            if self.config.picture == "unreadable":
                url = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                await player.turn([vf.UserMessage(content=[text, url])])
                return
            rng = random.Random(zlib.crc32(segment.last_reply.encode()))
            picture = draw_shape(rng.choice(SHAPES), rng.choice(sorted(COLOURS)), 28, rng)
            await player.turn([{"role": "user", "content": [text, {"type": "image", "image": picture}]}])


__all__ = ["ShowAnother", "ShowAnotherConfig"]
"""


@pytest.fixture
def show_another(tmp_path, monkeypatch):
    """Environment(taskset, env_args) of the Env above paired with a taskset (`shapes`: a picture prompt,
    `reverse-text`: a text one)."""
    (tmp_path / "show_another.py").write_text(textwrap.dedent(SHOW_ANOTHER))
    monkeypatch.syspath_prepend(str(tmp_path))
    return lambda taskset, **env_args: Environment(
        EnvSpec(id=f"show-another+{taskset}", args={"num_tasks": 3}, env_args=env_args)
    )


def play_episodes(path: str, env: Environment, engine=None, budget: PixelBudget | None = None):
    """(the engine, the driver's prompt ids, the rollouts): the Env's prompts x 3 episodes of two turns at
    most, the prompts rendered as the driver renders them (pictures or text), sampled by `engine` (a
    BuiltinEngine on its plain path when None) at temperature 1."""
    tokenizer = load_tokenizer(path)
    renderer = ImagePrompts.for_envs(tokenizer, [env], budget=budget)
    prompts = [(env, ex) for ex in env.examples]
    if renderer is None:  # a text taskset
        ids, vision = [prompt_token_ids(tokenizer, ex) for ex in env.examples], {}
    else:
        prompts, ids, vision = renderer.render_all(prompts)
    if engine is None:
        engine = BuiltinEngine(fast="off")
        engine.setup(path)
    sampling = SamplingSettings(temperature=1.0, max_tokens=6, seed=3, stop=STOPS)
    groups = generate_rollouts(engine, tokenizer, prompts, 3, sampling, 0, ids, TurnLimits(2, 1024, budget), vision)
    return engine, ids, groups


@pytest.mark.parametrize("taskset", ["shapes", "reverse-text"])
def test_a_later_turn_with_a_picture_is_sampled_and_scored_faithfully(vl_family, show_another, taskset):
    family, path, _, _ = vl_family
    engine, ids, groups = play_episodes(path, show_another(taskset))
    placeholders = image_token_ids(engine.model.config)
    tokenizer = load_tokenizer(path)
    first = 1 if taskset == "shapes" else 0  # the pictures of the task's prompt
    rollouts = [r for group in groups for r in group]
    shown = [r for r in rollouts if "Now this one:" in r.completion_text]
    assert len(shown) >= len(rollouts) // 2, [r.completion_text for r in rollouts]
    for group, prompt_ids in zip(groups, ids):
        for r in group:
            assert r.prompt_ids == prompt_ids  # the episode renders the role's prompt as the driver does
            assert not any(m and t in placeholders for t, m in zip(r.completion_ids, r.completion_mask))
            trained = tokenizer.decode([t for t, m in zip(r.completion_ids, r.completion_mask) if m])
            assert "Now this one" not in trained
            grids = r.vision.tensors.get("image_grid_thw") if r.vision is not None else None
            assert grids is None or grids.shape[0] == first + (r in shown)  # Qwen2.5-VL: a grid per picture
            assert (r.vision is not None) == bool(first or r in shown)
    for r in shown:  # the later picture: in the chat as a data: URL part, its placeholders in the sequence
        assert any(t in placeholders for t in r.completion_ids)
        later = r.messages[r.messages.index(next(m for m in r.messages if m["role"] == "assistant")) + 1]
        assert later["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
    json.dumps([r.messages for r in rollouts])
    pixels = [r.vision.tensors["pixel_values"] for r in shown]
    assert any(p.shape != pixels[0].shape or not torch.equal(p, pixels[0]) for p in pixels[1:])
    error = mismatch(engine, rollouts)
    print(f"{family} {taskset}: Env episode, a later turn() with a picture: token_mult_prob_error {error:.9f}")
    assert abs(error - 1) < 1e-4
    swapped = swapped_within_groups([r for r in group if r in shown] for group in groups)  # another's later picture
    error = mismatch(engine, swapped)
    print(f"{family} {taskset}: scored with another rollout's later picture: {error:.6f}")
    assert abs(error - 1) > 1e-3  # so the check above sees each rollout's own later picture


def served_episodes(path: str, env: Environment):
    """play_episodes through RemoteEngine in front of `grpokit infer` (a BuiltinEngine on `path`): (the
    server's engine, the driver's prompt ids, the rollouts' groups)."""
    with serving(path) as (engine, server):
        remote = RemoteEngine(base_url=server.url, model_name="tiny", max_retries=0)
        remote.setup(path)
        _, ids, groups = play_episodes(path, env, remote)
    return engine, ids, groups


def test_remote_engine_sends_an_episodes_picture_prompt_to_grpokit_infer(vl_family, look_again):
    """The role's prompt with its picture goes to the server in each of the episode's requests; the server's
    logprobs are the trainer's, with each example's own picture."""
    family, path, _, _ = vl_family
    engine, ids, groups = served_episodes(path, look_again)
    placeholders = image_token_ids(engine.model.config)
    rollouts = [r for group in groups for r in group]
    for group, prompt_ids in zip(groups, ids):
        for r in group:
            assert r.prompt_ids == prompt_ids and any(t in placeholders for t in r.prompt_ids)
            assert r.vision is not None and r.messages[0]["content"][0]["type"] == "image_url"
    asked_again = [r for r in rollouts if "Look again" in r.completion_text]  # the second request, answered
    assert len(asked_again) >= len(rollouts) // 2, [r.completion_text for r in rollouts]
    error = mismatch(engine, rollouts)
    print(f"{family}: RemoteEngine, Env episode with a picture: token_mult_prob_error {error:.9f}")
    assert abs(error - 1) < 1e-4
    swapped = [replace(r, vision=other[0].vision) for g, other in zip(groups, groups[1:] + groups[:1]) for r in g]
    assert abs(mismatch(engine, swapped) - 1) > 1e-3  # the server saw each episode's own picture


@pytest.mark.parametrize("taskset", ["shapes", "reverse-text"])
def test_remote_engine_sends_a_later_turn_picture_to_grpokit_infer(vl_family, show_another, taskset):
    """A later turn() message's picture goes to the server with every picture before it; the server's logprobs
    are the trainer's, with each rollout's own later picture."""
    family, path, _, _ = vl_family
    engine, _, groups = served_episodes(path, show_another(taskset))
    placeholders = image_token_ids(engine.model.config)
    first = 1 if taskset == "shapes" else 0  # the pictures of the task's prompt
    rollouts = [r for group in groups for r in group]
    shown = [r for r in rollouts if "Now this one:" in r.completion_text]
    assert len(shown) >= len(rollouts) // 2, [r.completion_text for r in rollouts]
    for r in shown:  # the later picture: its placeholders in the sequence, its pixels in the image inputs
        last_picture = max(i for i, t in enumerate(r.completion_ids) if t in placeholders)
        assert any(r.completion_mask[last_picture:])  # the server sampled a reply after it
        grids = r.vision.tensors.get("image_grid_thw")
        assert grids is None or grids.shape[0] == first + 1  # Qwen2.5-VL: a grid per picture
    error = mismatch(engine, rollouts)
    print(f"{family} {taskset}: RemoteEngine, a later turn() with a picture: token_mult_prob_error {error:.9f}")
    assert abs(error - 1) < 1e-4
    swapped = swapped_within_groups([r for r in group if r in shown] for group in groups)  # another's later picture
    assert abs(mismatch(engine, swapped) - 1) > 1e-3  # the server saw each rollout's own later picture


def test_a_later_turn_picture_is_refused_to_a_text_only_policy_naming_the_role(show_another, tiny_model):
    refusal = (
        r"environment 'show-another\+reverse-text' example \d+: its Env.run raised ValueError: environment "
        r"'show-another\+reverse-text' example \d+ role 'player': turn\(\) sent a message with images; the "
        r"conversation has images, but the policy .* is a text-only model"
    )
    with pytest.raises(ValueError, match=refusal):
        play_episodes(tiny_model, show_another("reverse-text"))


@pytest.mark.parametrize(
    "picture, budget, reason",
    [
        ("unreadable", None, r"image .data:image/png;base64,AAAA. is unreadable"),
        ("shape", PixelBudget(max_images=1), "a later turn brings the conversation to 2 images, more than"),
    ],
)
def test_an_unusable_later_turn_picture_stops_the_run_naming_the_role(vl_family, show_another, picture, budget, reason):
    refusal = (
        r"environment 'show-another\+shapes' example \d+: its Env.run raised ImageError: environment "
        rf"'show-another\+shapes' example \d+ role 'player': .*{reason}"
    )
    with pytest.raises(ValueError, match=refusal):
        play_episodes(vl_family[1], show_another("shapes", picture=picture), budget=budget)


def test_an_engine_that_cannot_sample_a_later_turn_picture_is_refused(vl_family, show_another, monkeypatch):
    refusal = (
        r"environment 'show-another\+shapes' example \d+: turn\(\) sent a message with images, which "
        r"NoLaterImages cannot sample in a later turn yet: use inference BuiltinEngine"
    )

    def play(path, monkeypatch, engine):
        return play_episodes(path, show_another("shapes"), engine)

    refused_at_the_turn(vl_family[1], play, monkeypatch, refusal)
