"""Buffer rules: online difficulty filtering and dynamic sampling, on crafted rewards and end to end."""

import pytest

from grpokit.main import main
from grpokit.orchestrator.buffer import BufferSettings
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics


def test_online_difficulty_filtering_drops_all_zero_and_all_one_groups():
    rules = BufferSettings(online_difficulty_filtering=True)
    assert not rules.keep([0.0, 0.0, 0.0]) and not rules.keep([1.0, 1.0])
    assert rules.keep([0.0, 1.0]) and rules.keep([0.5, 0.5])  # equal but not 0/1: kept (no dynamic sampling)
    assert rules.rounds == 1


def test_dynamic_sampling_drops_equal_reward_groups_and_allows_rounds():
    rules = BufferSettings(dynamic_sampling=True, max_resample_times=2)
    assert not rules.keep([0.5, 0.5]) and rules.keep([0.5, 0.25])
    assert rules.rounds == 3


def test_negative_resample_times_is_rejected():
    with pytest.raises(ValueError, match="max_resample_times"):
        BufferSettings(max_resample_times=-1)


def run(tmp_path, tiny_model, name, temperature):
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        name,
        "--data.sampling.max_tokens",
        "6",
        "--data.sampling.temperature",
        str(temperature),
        "--data.buffer.dynamic_sampling",
        "true",
        "--data.buffer.max_resample_times",
        "2",
        "--trainer.max_steps",
        "2",
        "--ckpt.interval",
        "0",
    )
    assert main(argv) == 0
    return read_metrics(tmp_path / name)


def test_dynamic_sampling_end_to_end(tmp_path, tiny_model):
    # greedy decoding: the 4 completions of a prompt are identical, so every group has equal rewards:
    # dynamic sampling uses all 3 rounds (3 x 2 prompts) and trains on nothing rather than on noise
    greedy = run(tmp_path, tiny_model, "greedy", 0.0)
    assert [float(r["groups_generated"]) for r in greedy] == [6.0, 6.0]
    assert [float(r["groups_trained"]) for r in greedy] == [0.0, 0.0]
    assert all(float(r["grad_norm"]) == 0.0 for r in greedy)
    # sampling at temperature 1: rewards differ within groups, the first round suffices
    sampled = run(tmp_path, tiny_model, "sampled", 1.0)
    assert all(float(r["groups_trained"]) == 2.0 for r in sampled)
