"""A verifiers Env episode whose task's prompt holds a picture (issue 36): the role's prompt is rendered by
the processor as the driver renders a first prompt with images, every reply of the episode is sampled with
the picture, and the trained role's rollout is token-faithful on both tiny families (in `grpokit fit` too);
no image token is trained on; a text-only policy is refused at start naming the environment."""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace

import pytest

from grpokit.common.models import load_tokenizer
from grpokit.environments.environment import Environment, EnvSpec
from grpokit.inference import SamplingSettings
from grpokit.inference.builtin import BuiltinEngine
from grpokit.orchestrator.group_play import generate_rollouts
from grpokit.orchestrator.image_prompts import ImagePrompts
from grpokit.orchestrator.rollouts import TurnLimits
from grpokit.vision.logprobs import image_token_ids
from tests.vision.test_later_turn_images import STOPS, fit_base, fit_faithfully, mismatch

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
