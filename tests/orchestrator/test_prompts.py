"""Prompt order: pooled, or mixed by env ratios; a function of the block index."""

import json

import pytest

from grpokit.environments.environment import Environment, EnvSpec
from grpokit.main import main
from grpokit.orchestrator.prompts import PromptSampler
from grpokit.testing import tiny_fit_argv


@pytest.fixture(scope="module")
def envs():
    return [
        Environment(EnvSpec(id="reverse-text", args={"num_tasks": 20})),
        Environment(EnvSpec(id="arithmetic", args={"num_tasks": 20})),
    ]


def test_largest_remainder_counts(envs):
    sampler = PromptSampler(envs, seed=0, ratios=[0.75, 0.25])
    assert sampler.counts(4) == [3, 1]
    assert sampler.counts(2) == [2, 0]  # exact [1.5, 0.5]: the tie goes to the first environment
    assert sum(sampler.counts(7)) == 7


def test_blocks_are_deterministic_and_mixed(envs):
    a, b = PromptSampler(envs, seed=3, ratios=[3, 1]), PromptSampler(envs, seed=3, ratios=[3, 1])
    block = a.take(5, 4)
    assert [(e.name, x.index) for e, x in block] == [(e.name, x.index) for e, x in b.take(5, 4)]
    assert [e.name for e, _ in block] == ["reverse-text"] * 3 + ["arithmetic"]
    assert [x.index for _, x in a.take(6, 4)] != [x.index for _, x in block]  # the next block moves on


def test_pooled_block_equals_sequential_walk(envs):
    a, b = PromptSampler(envs, seed=1), PromptSampler(envs, seed=1)
    b.next(8)
    assert [x.index for _, x in a.take(2, 4)] == [x.index for _, x in b.next(4)]


def test_bad_ratios_are_rejected(envs):
    with pytest.raises(ValueError, match="one non-negative weight per environment"):
        PromptSampler(envs, seed=0, ratios=[1.0])


def test_env_ratios_end_to_end(tmp_path, tiny_model):
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "r",
        "--data.env",
        '[{"id": "reverse-text", "ratio": 3}, {"id": "arithmetic", "ratio": 1}]',
        "--data.rollouts_per_example",
        "2",
        "--data.sampling.max_tokens",
        "6",
        "--data.seq_len",
        "256",
        "--data.eval",
        "null",
        "--data.num_logged_samples",
        "100",
        "--trainer.max_steps",
        "2",
        "--ckpt.interval",
        "0",
    )
    assert main(argv) == 0
    samples = [json.loads(line) for line in open(tmp_path / "r" / "samples.jsonl")]
    for step in (0, 1):
        envs_of_step = [s["env"] for s in samples if s["step"] == step]
        assert envs_of_step.count("reverse-text") == 6 and envs_of_step.count("arithmetic") == 2
