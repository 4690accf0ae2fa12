"""A tool that returns a picture (issue 36): its result becomes image parts, rendered by the processor after
the conversation so far (the same ids as the whole chat rendered at once; in a user message after the tool's
text where the template cannot show a picture in a tool message), every later turn is sampled with the
picture, and the trainer's logprobs are the engine's (both tiny families, `grpokit fit` too); the picture's
tokens are never in the loss; a picture over data.pixel_budget is the tool's error, a text-only policy and
an engine without later-turn images are refused naming the example.

The random models never write a tool call, so the rollout tests read each reply as a call of `look` (the
parser is patched); everything after the call (the tool, its picture, rendering, sampling, scoring) is real.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import re

import pytest
import torch

from grpokit.common.models import load_tokenizer
from grpokit.common.once import Once
from grpokit.environments import conversation, tool_images
from grpokit.environments.chat_tokens import ChatTokens
from grpokit.environments.conversation import Conversation, environment_turn
from grpokit.environments.environment import Environment, EnvSpec
from grpokit.environments.image_turns import ImageTurns
from grpokit.environments.tool_images import picture_parts, portable_parts
from grpokit.environments.tools import ToolCall, run_tool_calls
from grpokit.envs.shapes import COLOURS, SHAPES, ShapesTask, draw_shape
from grpokit.inference.remote import RemoteEngine
from grpokit.vision.images import PixelBudget, load_image
from grpokit.vision.logprobs import image_token_ids
from grpokit.vision.render import render_prompt
from tests.support.servers import serving
from tests.vision.pictures import striped
from tests.vision.test_later_turn_images import (
    STOPS,
    fit_base,
    fit_faithfully,
    groups_of,
    load_config,
    mismatch,
    refused_at_the_turn,
    swapped_within_groups,
    two_turns,
)

SHOWN = "Here it is:"


def look(seed: int = 0):
    """Look at the shape again.

    Args:
        seed: which picture.
    """
    shape, colour = SHAPES[seed % len(SHAPES)], sorted(COLOURS)[seed % len(COLOURS)]
    return [SHOWN, draw_shape(shape, colour, 28, random.Random(seed))]


def calls_look(text: str) -> list[ToolCall]:
    """Every reply read as a call of `look`, seeded by its length (so rollouts of a group see different pictures)."""
    return [ToolCall("look", {"seed": len(text)})]


def test_a_tools_picture_becomes_json_image_parts():
    picture = striped(8, 6, 1)
    [part] = picture_parts(picture, 100)
    assert part["type"] == "image_url" and load_image(part["image_url"]["url"]).tobytes() == picture.tobytes()
    url = {"type": "image_url", "image_url": {"url": "data:x"}}
    parts = picture_parts(("abcdef", {"type": "image", "image": picture}, url, {"type": "text", "text": "gh"}), 7)
    assert [p["type"] for p in parts] == ["text", "image_url", "image_url", "text"]
    assert parts[0]["text"] + parts[3]["text"] == "abcdefg" and parts[2] is url  # text cut at 7 characters, in all
    json.dumps(parts)  # the chat stays JSON (samples.jsonl), and verifiers' ToolMessage takes image_url parts
    assert picture_parts("text", 100) is None and picture_parts([{"type": "text", "text": "a"}], 100) is None
    assert picture_parts({"a": 1}, 100) is None  # no picture: JSON text, as before
    respond_parts = portable_parts([{"type": "image", "image": picture}, {"type": "text", "text": "t"}])
    assert respond_parts[0]["type"] == "image_url" and respond_parts[1] == {"type": "text", "text": "t"}

    def bad():
        return [picture, {"type": "audio", "audio": "x"}]

    results = run_tool_calls({"look": look, "bad": bad}, [ToolCall("look", {"seed": 2}), ToolCall("bad")], 10.0)
    assert results[0].status == "ok" and results[0].content[0] == {"type": "text", "text": SHOWN}
    assert results[1].status == "error"
    assert results[1].content.startswith("Error: the tool 'bad' returned a picture grpokit cannot read (")
    assert "part of type 'audio'" in results[1].content


def test_a_tool_picture_renders_as_the_whole_chat_does_in_the_tool_message_or_after_it(vl_family):
    """The tiny templates show a picture in a tool message; one that does not gets it in a user message right
    after the tool's text. Either way prompt + reply + the rendered turn are the whole chat's ids."""
    _, path, processor, _ = vl_family
    tokenizer = load_tokenizer(path)
    question = [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]
    first_picture, tool_picture = striped(56, 42, 1), striped(28, 28, 2)
    reply = tokenizer.encode("It is red<|im_end|>", add_special_tokens=False)
    tool_turn = [{"role": "tool", "content": picture_parts(["Here:", tool_picture], 100)}]
    hidden = copy.copy(processor)  # a template that drops an image part in a tool message
    hidden.chat_template = processor.chat_template.replace(
        "{% if part['type'] == 'image' %}", "{% if part['type'] == 'image' and message['role'] != 'tool' %}"
    )
    head = [{"role": "user", "content": question}, {"role": "assistant", "content": "It is red"}]
    shown_in_tool = [{"role": "tool", "content": [{"type": "text", "text": "Here:"}, {"type": "image"}]}]
    after_tool = [{"role": "tool", "content": "Here:"}, {"role": "user", "content": [{"type": "image"}]}]
    for template, expected, shows in ((processor, shown_in_tool, True), (hidden, after_tool, False)):
        turns = ImageTurns(tokenizer)
        turns._processor = template
        env_ids, vision, count = turns.render("test", ChatTokens(tokenizer), reply, tool_turn, held=1)
        assert turns.tool_pictures is shows and count == 1
        first = render_prompt(template, [head[0]], [first_picture])
        whole = render_prompt(template, [*head, *expected], [first_picture, tool_picture])
        assert first.prompt_ids + reply + env_ids == whole.prompt_ids
        assert any(t in image_token_ids(load_config(path)) for t in env_ids)
        alone = render_prompt(template, expected, [tool_picture]).vision  # the turn's image inputs: its picture's
        assert torch.equal(vision.tensors["pixel_values"], alone.tensors["pixel_values"])


def opened_with_a_call(seed: int = 1) -> Conversation:
    """A shapes conversation (its first prompt holds one picture) whose reply calls `look`."""
    env = Environment(EnvSpec("shapes", {"num_tasks": 2}))
    example = env.examples[1]
    conv = Conversation.opening(env, example, [])
    call = json.dumps({"name": "look", "arguments": {"seed": seed}})
    conv.messages.append({"role": "assistant", "content": f"<tool_call>{call}</tool_call>"})
    return conv


@pytest.mark.parametrize(
    "budget, reason",
    [
        (PixelBudget(max_images=1), r"the conversation would hold 2 images, more than the model takes \(data.pixel_"),
        (PixelBudget(max_pixels=100, over_budget="refuse"), r"image of 28x28 = 784 pixels is over the budget of 100"),
    ],
)
def test_a_tool_picture_over_the_budget_is_the_tools_error_logged_naming_the_example(
    budget, reason, monkeypatch, caplog
):
    monkeypatch.setattr(ShapesTask, "tools", [look], raising=False)
    monkeypatch.setattr(tool_images, "_WARNED", Once())
    conv = opened_with_a_call()
    with caplog.at_level(logging.WARNING):
        turn = environment_turn(conv, budget=budget)
    [message] = turn.messages
    assert message["role"] == "tool" and isinstance(message["content"], str)
    assert message["content"].startswith("Error: the tool 'look' returned a picture that cannot be used: ")
    assert re.search(reason, message["content"]), message["content"]
    assert conv.tool_calls == 1 and conv.tool_errors == 1
    [warning] = [r.getMessage() for r in caplog.records if "cannot be used" in r.getMessage()]
    assert warning.startswith("environment 'shapes' example 1: the tool 'look' returned a picture that cannot be")
    resized = environment_turn(opened_with_a_call(), budget=PixelBudget(max_pixels=100))  # over_budget: resize
    assert resized.messages[0]["content"][1]["type"] == "image_url"  # kept: the renderer scales it to fit


def test_a_text_only_policy_is_refused_a_tool_picture_naming_the_example(tiny_model):
    text = load_tokenizer(tiny_model)
    tool_turn = [{"role": "tool", "content": picture_parts(look(1), 100)}]
    with pytest.raises(ValueError, match=r"env 'e' example 0: a tool returned a picture; the conversation has "
                       r"images, but the policy .* is a text-only model"):  # fmt: skip
        ImageTurns(text).render("env 'e' example 0", ChatTokens(text), [], tool_turn, held=0)


def play(path: str, monkeypatch, engine=None):
    """Four shapes prompts x 3 rollouts, each first reply answered by `look`'s picture; two turns at most."""
    monkeypatch.setattr(ShapesTask, "tools", [look], raising=False)
    monkeypatch.setattr(conversation, "parse_tool_calls", calls_look)
    return two_turns(path, Environment(EnvSpec("shapes", {"num_tasks": 4})), engine)


def test_tool_pictures_are_sampled_and_scored_faithfully_with_a_mask_on_replies_only(vl_family, monkeypatch):
    family, path, _, _ = vl_family
    engine, rollouts = play(path, monkeypatch)
    placeholders = image_token_ids(engine.model.config)
    shown = [r for r in rollouts if SHOWN in r.completion_text]
    assert len(shown) >= len(rollouts) // 2, [r.completion_text for r in rollouts]
    tokenizer = load_tokenizer(path)
    for r in shown:
        assert r.messages[2]["role"] == "tool" and r.messages[2]["content"][1]["type"] == "image_url"
        assert r.metrics["tool_calls"] == 1 and r.metrics["tool_errors"] == 0
        grids = r.vision.tensors.get("image_grid_thw")
        assert grids is None or grids.shape[0] == 2  # Qwen2.5-VL: the prompt's picture and the tool's
        assert sum(t in placeholders for t in r.completion_ids) > 0  # the tool's picture, in the completion region
    for r in rollouts:  # the environment's tokens (the tool's text, its picture) are never in the loss
        assert not any(m and t in placeholders for t, m in zip(r.completion_ids, r.completion_mask))
        trained = tokenizer.decode([t for t, m in zip(r.completion_ids, r.completion_mask) if m])
        assert SHOWN not in trained and "tool" not in trained
    json.dumps([r.messages for r in rollouts])  # as samples.jsonl writes them
    error = mismatch(engine, rollouts)
    print(f"{family}: BuiltinEngine, tool pictures: token_mult_prob_error {error:.9f}")
    assert abs(error - 1) < 1e-4
    error = mismatch(engine, swapped_within_groups(groups_of(shown)))
    print(f"{family}: scored with another rollout's tool picture: {error:.6f}")
    assert abs(error - 1) > 1e-3  # so the check above sees each rollout's own picture


def test_remote_engine_sends_tool_pictures_to_grpokit_infer(vl_family, monkeypatch):
    """RemoteEngine in front of `grpokit infer`: the turn after the tool's call carries the prompt's picture and
    the tool's, and the server's logprobs are the trainer's."""
    family, path, _, _ = vl_family
    with serving(path) as (engine, server):
        remote = RemoteEngine(base_url=server.url, model_name="tiny", max_retries=0)
        remote.setup(path)
        _, rollouts = play(path, monkeypatch, remote)
    placeholders = image_token_ids(engine.model.config)
    shown = [r for r in rollouts if SHOWN in r.completion_text]
    assert len(shown) >= len(rollouts) // 2, [r.completion_text for r in rollouts]
    for r in shown:  # the tool's picture: in the chat, in the rollout's image inputs, its placeholders sampled on
        assert r.messages[2]["role"] == "tool" and r.messages[2]["content"][1]["type"] == "image_url"
        assert r.metrics["tool_calls"] == 1 and r.metrics["tool_errors"] == 0
        grids = r.vision.tensors.get("image_grid_thw")
        assert grids is None or grids.shape[0] == 2  # Qwen2.5-VL: the prompt's picture and the tool's
        last_picture = max(i for i, t in enumerate(r.completion_ids) if t in placeholders)
        assert any(r.completion_mask[last_picture:])  # the server sampled a reply after the tool's picture
    error = mismatch(engine, rollouts)
    print(f"{family}: RemoteEngine, tool pictures: token_mult_prob_error {error:.9f}")
    assert abs(error - 1) < 1e-4
    # the server sampled each reply with the rollout's own tool picture: another's is not the server's logprobs
    assert abs(mismatch(engine, swapped_within_groups(groups_of(shown))) - 1) > 1e-3


def test_an_engine_that_cannot_sample_a_tool_picture_is_refused_naming_the_example(vl_family, monkeypatch):
    refusal = (
        r"environment 'shapes' example \d+: a tool returned a picture, which NoLaterImages cannot sample in a "
        r"later turn yet: use inference BuiltinEngine with fast: off"
    )
    refused_at_the_turn(vl_family[1], play, monkeypatch, refusal)


def test_fit_trains_on_tool_pictures_token_faithfully(vl_family, tmp_path, monkeypatch):
    family, path, _, _ = vl_family
    monkeypatch.setattr(ShapesTask, "tools", [look], raising=False)
    monkeypatch.setattr(conversation, "parse_tool_calls", calls_look)
    env = [{"id": "shapes", "args": {"num_tasks": 16}}]
    argv = [*fit_base(tmp_path, path, family, env), "--data.sampling.stop", json.dumps(STOPS), "--data.max_turns", "2"]
    rows = fit_faithfully(argv, tmp_path / family)
    assert all(float(r["env/tool_calls"]) > 0 for r in rows), rows
    samples = [json.loads(line) for line in open(tmp_path / family / "samples.jsonl")]
    assert sum(SHOWN in s["completion"] for s in samples) >= len(samples) // 2, samples[:4]
    print(family, "tool pictures, fit:", [r["token_mult_prob_error"] for r in rows])
