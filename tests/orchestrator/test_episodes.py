"""verifiers Envs with their own `run(task, agents)` (a game master, verifiers' user-sim), played by
grpokit's engine: the trained role's conversation is token-faithful, the other roles are played but not
trained, limits end exchanges with a terminated Segment, and a broken Env names itself."""

from __future__ import annotations

import textwrap

import pytest
import torch

from grpokit.common.logprobs import packed_token_logprobs
from grpokit.common.models import load_tokenizer
from grpokit.environments.chat_tokens import ChatTokens
from grpokit.environments.environment import Environment, EnvSpec
from grpokit.inference import SamplingSettings
from grpokit.orchestrator.group_play import TurnLimits, generate_rollouts
from grpokit.orchestrator.packing import pack
from grpokit.trainer.metrics import mismatch_metrics

# A game master Env written as verifiers' docs write one: it opens the exchange (the task's prompt is
# the master's), answers each guess with a hint, and records a finalize metric. `Fail` sets how it breaks.
GAME = """
import time

import verifiers.v1 as vf


class HintsConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(max_turns=3)
    judge: vf.AgentConfig = vf.AgentConfig()
    fail: str = ""


class Hints(vf.Env[HintsConfig]):
    async def setup(self, agents):
        if self.config.fail != "two_trainable":
            agents.judge.trainable = False

    async def run(self, task, agents):
        if self.config.fail == "raise":
            raise RuntimeError("the game server is down")
        if self.config.fail == "block":  # a synchronous call that blocks the event loop
            time.sleep(20)
        hidden = type(task)(task.data.model_copy(update={"prompt": None}), task.config)
        async with agents.player.interaction(hidden) as player:
            segment = await player.turn("Guess the hidden word. Hint 1: it is short.")
            hint = 2
            while not segment.terminated:
                segment = await player.turn(f"No. Hint {hint}: you wrote {len(segment.last_reply)} characters.")
                hint += 1
        if self.config.fail == "two_trainable":
            async with agents.judge.interaction(hidden) as judge:
                await judge.turn("Judge it.")

    async def finalize(self, task, episode):
        for trace in episode.traces:
            trace.record_metric("episode_traces", float(len(episode.traces)))


__all__ = ["Hints", "HintsConfig"]
"""


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2-135m")


@pytest.fixture
def game(tmp_path, monkeypatch):
    (tmp_path / "hints_game.py").write_text(textwrap.dedent(GAME))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "hints-game+reverse-text"


@pytest.fixture(scope="module")
def engine(tiny_model):
    from grpokit.inference.builtin import BuiltinEngine

    engine = BuiltinEngine(device="cpu")
    engine.setup(tiny_model)
    engine.weight_step = 0
    return engine


SAMPLING = SamplingSettings(temperature=1.0, max_tokens=12, stop=["e"], seed=3)  # a random model: stop on a letter


def test_a_game_masters_episode_is_token_faithful_and_trains_the_player_only(game, engine, tiny_model, tokenizer):
    env = Environment(EnvSpec(id=game, args={"num_tasks": 2}))
    assert env.episode_env is not None
    (group,) = generate_rollouts(engine, tokenizer, [(env, env.examples[0])], 2, SAMPLING, 5, turns=TurnLimits(8, 400))
    chat = ChatTokens(tokenizer)
    assert [r.group_id for r in group] == [5, 5] and all(r.env_id == game for r in group)
    for r in group:
        # the game opened the exchange: the prompt is the system prompt and the master's first message
        assert [m["role"] for m in r.messages[:2]] == ["system", "user"] and "Hint 1" in r.messages[1]["content"]
        assert r.prompt_ids == chat.prompt(r.messages[:2])
        assert r.metrics["turns"] == 3  # the player's AgentConfig.max_turns
        assert r.metrics["episode_traces"] == 1.0  # finalize saw the episode (the judge never played)
        assert r.completion_ids != group[0].completion_ids or r is group[0]  # the group's episodes differ
        # the master's hints are rendered after the engine's tokens, never trained on
        hints = [m for m in r.messages[2:] if m["role"] == "user"]
        assert len(hints) == 2
        starts = [i for i in range(1, len(r.completion_mask)) if r.completion_mask[i - 1] == 1 > r.completion_mask[i]]
        for start, hint in zip(starts, hints):
            env_ids = chat.after_completion(r.completion_ids[:start], [hint])
            assert r.completion_ids[start : start + len(env_ids)] == env_ids
            assert not any(r.completion_mask[start : start + len(env_ids)])
    (mb,) = pack(group, [[1.0] * len(r.completion_ids) for r in group], [True] * len(group), 2048)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        trainer = packed_token_logprobs(model, mb.input_ids_T, mb.position_ids_T, mb.seq_lens_N, 1.0)
    error = mismatch_metrics(trainer, mb.inference_logprobs_T, mb.loss_mask_T)["token_mult_prob_error"]
    assert abs(float(error) - 1) < 1e-4


def test_verifiers_user_sim_plays_both_sides_and_trains_the_assistant(engine, tokenizer):
    """verifiers' own user-sim Env over grpokit's reverse-text tasks: the engine plays the (untrained)
    user, who opens and answers; the assistant's exchange is the rollout, scored by the task's rubric."""
    env = Environment(EnvSpec(id="user-sim+reverse-text", args={"num_tasks": 2}, env_args={"user": {"max_turns": 2}}))
    (group,) = generate_rollouts(engine, tokenizer, [(env, env.examples[1])], 2, SAMPLING, 0, turns=TurnLimits(8, 600))
    for r in group:
        roles = [m["role"] for m in r.messages]
        assert roles[0] == "system" and roles[1] == "user" and "assistant" in roles
        assert r.messages[0]["content"] == env.examples[1].task.data.system_prompt  # the assistant's, not the persona
        assert "Hello! How can I help" not in r.messages[1]["content"]  # the greeting exists on the user's side only
        assert r.metrics["user_turns"] in (1.0, 2.0)  # user-sim's finalize; the user's max_turns ended it
        assert 0.0 <= r.reward <= 1.0 and "exact" in r.metrics  # reverse-text's rubric, on the nulled row


def test_limits_and_budget_end_exchanges_with_a_terminated_segment(game, engine, tokenizer):
    env = Environment(EnvSpec(id=game, args={"num_tasks": 2}, env_args={"player": {"max_turns": 8}}))
    first = len(ChatTokens(tokenizer).prompt([*env.examples[0].messages[:1], {"role": "user", "content": "x" * 20}]))
    (group,) = generate_rollouts(
        engine, tokenizer, [(env, env.examples[0])], 2, SAMPLING, 0, turns=TurnLimits(2, first + 70)
    )
    for r in group:  # player.max_turns 8 is its own; the budget ends the game first, at a turn boundary
        assert r.is_truncated and r.num_tokens <= first + 70 and r.completion_mask[-1] == 1


def test_broken_episodes_and_configs_name_the_environment(game, engine, tokenizer):
    broken = Environment(EnvSpec(id=game, env_args={"fail": "raise"}))
    with pytest.raises(ValueError, match="Env.run raised RuntimeError: the game server is down"):
        generate_rollouts(engine, tokenizer, [(broken, broken.examples[0])], 1, SAMPLING, 0)
    two = Environment(EnvSpec(id=game, env_args={"fail": "two_trainable"}))
    with pytest.raises(ValueError, match="trains one exchange per episode"):
        generate_rollouts(engine, tokenizer, [(two, two.examples[0])], 1, SAMPLING, 0)
    with pytest.raises(ValueError, match="bad env_args"):
        Environment(EnvSpec(id=game, env_args={"player": {"max_turns": "many"}}))
    with pytest.raises(ValueError, match="has no verifiers Env"):
        Environment(EnvSpec(id="reverse-text", env_args={"persona": "x"}))
    with pytest.raises(ValueError, match="unknown verifiers Env 'no-such-env'"):
        Environment(EnvSpec(id="no-such-env+reverse-text"))


def test_an_env_run_blocked_in_a_synchronous_call_stops_the_run_naming_it(game, engine, tokenizer, monkeypatch):
    """`time.sleep` (or any blocking call) in Env.run blocks the event loop, so the loop's own deadline
    cannot fire; the wait for the loop's thread is bounded too, and the error names the environment."""
    import time

    from grpokit.environments import episodes

    monkeypatch.setattr(episodes, "SETTLE_TIMEOUT", 0.5)
    monkeypatch.setattr(episodes, "BLOCKED_GRACE", 0.5)
    blocked = Environment(EnvSpec(id=game, env_args={"fail": "block"}))
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"environment 'hints-game\+reverse-text'.*blocked for 1 s in a synchronous"):
        generate_rollouts(engine, tokenizer, [(blocked, blocked.examples[0])], 1, SAMPLING, 0)
    assert time.monotonic() - start < 10
