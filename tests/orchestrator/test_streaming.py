"""Streaming rollouts (data.streaming) end to end on the tiny model: with max_async_level 0 and a step's
prompts in flight, a streamed run trains on exactly what whole-batch generation samples; with groups of
the next step in flight, the engine keeps decoding across weight updates and the timeline shows it;
groups are dropped by their oldest token."""

from __future__ import annotations

import json
import math

import pytest

from grpokit.common.timeline import read_timeline
from grpokit.main import main
from grpokit.orchestrator.streaming import StreamingSettings
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics


def fit(tmp_path, tiny_model, name, *extra) -> tuple:
    argv = tiny_fit_argv(tmp_path, tiny_model, name, "--model.lr", "1e-3", "--trainer.max_steps", "3", *extra)
    assert main(argv) == 0
    run = tmp_path / name
    return run, read_metrics(run)


def test_streaming_at_async_level_0_reproduces_whole_batch_generation(tmp_path, tiny_model):
    sync = ["--data.max_async_level", "0", "--data.sampling.stop", "[e]"]  # stops: groups finish at different steps
    _, whole = fit(tmp_path, tiny_model, "whole", *sync)
    run, streamed = fit(tmp_path, tiny_model, "streamed", *sync, "--data.streaming", "{max_inflight: 2}")
    assert [r["reward"] for r in streamed] == [r["reward"] for r in whole]
    assert [r["loss"] for r in streamed] == [r["loss"] for r in whole]
    assert all(float(r["mixed_weight_rollouts"]) == 0.0 for r in streamed)  # nothing decodes across an update
    spans = [e for e in read_timeline(run) if e["role"] == "group"]
    assert len(spans) == 3 * 2 and all(e["first_weights"] == e["last_weights"] == e["step"] for e in spans)


def test_streaming_keeps_groups_in_flight_across_weight_updates(tmp_path, tiny_model):
    run, rows = fit(
        tmp_path,
        tiny_model,
        "ahead",
        "--trainer.max_steps",
        "4",
        "--data.streaming",
        "{max_inflight: 6, on_update: continue}",
    )
    assert [int(r["step"]) for r in rows] == [0, 1, 2, 3]
    # groups that finished past a step's needs train in the next one, which still describes them
    assert all(float(r["groups_generated"]) >= float(r["groups_trained"]) == 2.0 for r in rows)
    assert all(math.isfinite(float(r["reward"])) and math.isfinite(float(r["reward_std"])) for r in rows)
    assert all(0.0 <= float(r["mixed_weight_rollouts"]) <= 1.0 for r in rows)
    # max_async_level 1 bounds a group's start; one that finishes after its step's batch trains a step later
    assert all(float(r["off_policy_gap_max"]) <= 2 for r in rows)
    events = read_timeline(run)
    spans = [e for e in events if e["role"] == "group"]
    assert len(spans) >= 4 * 2 and all(0 <= e["first_weights"] <= e["last_weights"] for e in spans)
    loaded = [e["step"] for e in events if e["role"] == "weights"]  # updates loaded by the stream, in order
    assert loaded[0] == 0 and len(loaded) >= 2 and loaded == sorted(set(loaded))
    samples = [json.loads(line) for line in open(run / "samples.jsonl")]
    assert all(s["policy_step"] >= s["step"] - 2 for s in samples)


def test_streaming_refuses_what_it_does_not_cover():
    from grpokit.orchestrator.datamodule import Orchestrator
    from grpokit.orchestrator.schedules import TemperatureSchedule

    with pytest.raises(ValueError, match="max_inflight must be >= 1"):
        StreamingSettings(max_inflight=0)
    with pytest.raises(ValueError, match="on_update must be continue, regenerate or finish, got 'pause'"):
        StreamingSettings(on_update="pause")
    with pytest.raises(ValueError, match="data.streaming and data.temp_scheduler"):
        Orchestrator(streaming=StreamingSettings(), temp_scheduler=TemperatureSchedule())


def test_multi_turn_games_stream_turn_by_turn(tmp_path, tiny_model):
    """A multi-turn game streams: each conversation's next turn is its own request, environment tokens
    stay out of the loss (the trainer's logprobs match the engine's on the trained tokens at step 0)."""
    from tests.support import MULTI_TURN_GAME_FLAGS

    game = [MULTI_TURN_GAME_FLAGS[0], "[{id: guess-number, args: {num_tasks: 50}}]", *MULTI_TURN_GAME_FLAGS[2:]]
    extra = ("--data.streaming", "{max_inflight: 3}", "--data.max_async_level", "0", "--data.seq_len", "400")
    run, rows = fit(tmp_path, tiny_model, "game", *game, *extra, "--data.num_logged_samples", "16")
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    assert all(float(r["env/turns"]) >= 1 for r in rows) and max(float(r["env/turns"]) for r in rows) > 1
    assert all(abs(float(r["token_mult_prob_error"]) - 1) < 1e-4 for r in rows)
    samples = [json.loads(line) for line in open(run / "samples.jsonl")]
    assert max(sum(m["role"] == "assistant" for m in s["messages"]) for s in samples) >= 2


def test_verifiers_env_episodes_stream_each_waiting_role_as_a_request(tmp_path, tiny_model):
    """verifiers' user-sim Env (the engine plays a simulated user, untrained) beside a multi-turn game,
    streamed: each waiting role's reply is a request of its own; the trained tokens are the engine's
    (the trainer's logprobs match at async 0) and the episodes run several turns."""
    from tests.support import MULTI_TURN_GAME_FLAGS

    extra = ("--data.streaming", "{max_inflight: 3}", "--data.max_async_level", "0", "--data.seq_len", "400")
    run, rows = fit(tmp_path, tiny_model, "ep", *MULTI_TURN_GAME_FLAGS, *extra, "--data.num_logged_samples", "16")
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    assert all(abs(float(r["token_mult_prob_error"]) - 1) < 1e-4 for r in rows)
    samples = [json.loads(line) for line in open(run / "samples.jsonl")]
    episodes = [s for s in samples if s["env"].startswith("user-sim")]
    assert episodes and max(sum(m["role"] == "assistant" for m in s["messages"]) for s in episodes) >= 2
    spans = [e for e in read_timeline(run) if e["role"] == "group"]
    assert len(spans) >= 3 * 2 and all(e["first_weights"] == e["last_weights"] == e["step"] for e in spans)


def test_groups_are_dropped_by_their_oldest_token(tmp_path, tiny_model):
    """A completion decoded across an update is as old as its oldest token (Rollout.policy_step), and
    the batch's max_off_policy_steps rule drops streamed groups by it, as it drops whole-batch ones."""
    from grpokit.inference import Completion
    from grpokit.orchestrator.rollouts import sampled_group
    from tests.support import ChatLengthEnv

    class Env(ChatLengthEnv):
        def score(self, examples, replies, finish_reasons=None):
            return [(1.0, {}) for _ in replies]

        def step_rewards(self, examples, replies):
            return [None for _ in replies]

    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            return "x" * len(ids)

    mixed = Completion([5, 6, 7, 8], [-1.0] * 4, False, policy_step=2, token_steps=[2, 2, 3, 3])
    example = type("Ex", (), {"index": 0})()
    (rollout,) = sampled_group(Env(), example, [1, 2], [mixed], 9, Tok())
    assert rollout.policy_step == 2 and rollout.token_steps == [2, 2, 3, 3]
    # one generation feeds 3 steps: at step 2 its groups are 2 steps old, past max_off_policy_steps 1
    _, rows = fit(
        tmp_path,
        tiny_model,
        "r",
        *("--data.num_iterations", "3", "--data.max_async_level", "0", "--data.max_off_policy_steps", "1"),
        *("--data.streaming", "{max_inflight: 2}", "--trainer.max_steps", "4", "--ckpt.interval", "0"),
    )
    assert [float(r["groups_trained"]) for r in rows] == [2.0, 2.0, 0.0, 2.0]
    assert [float(r["dropped_off_policy_groups"]) for r in rows] == [0.0, 0.0, 2.0, 0.0]
