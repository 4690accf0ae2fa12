"""Filters learn the policy's tokenizer when the orchestrator connects: Gibberish's defaults follow the tiny
model's SmolLM2 vocabulary (49_152 ids), where the Qwen values it had before could never flag a rollout."""

import json
import math

import pytest

from grpokit.broadcast.filesystem import FilesystemBroadcast
from grpokit.common.models import load_tokenizer
from grpokit.common.run_context import RunContext
from grpokit.environments.environment import EnvSpec
from grpokit.inference.remote import RemoteEngine
from grpokit.main import main
from grpokit.orchestrator import Orchestrator
from grpokit.registry.filters.gibberish import Gibberish
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics


def connect(tmp_path, tiny_model, filters):
    data = Orchestrator(
        env=[EnvSpec(id="reverse-text", args={"num_tasks": 4})], batch_size=8, rollouts_per_example=4, filters=filters
    )
    broadcast = FilesystemBroadcast()
    broadcast.setup(tmp_path)
    data.connect(
        RemoteEngine(), broadcast, load_tokenizer(tiny_model), RunContext(tmp_path, run_name_given=True), max_steps=1
    )
    return data


def test_gibberish_defaults_resolve_to_the_policy_tokenizer_and_explicit_values_stay(tmp_path, tiny_model):
    default, explicit = Gibberish(), Gibberish(token_id_threshold=40_000, vocab_size=50_000)
    connect(tmp_path, tiny_model, [default, explicit])
    assert (default.vocab_size, default.token_id_threshold) == (49_152, 36_864)
    assert default.logprob_threshold == pytest.approx(-math.log(49_152) - 2.0, abs=1e-12)
    assert (explicit.vocab_size, explicit.token_id_threshold) == (50_000, 40_000)


def test_qwen_values_on_a_smaller_vocabulary_are_refused_at_connect(tmp_path, tiny_model):
    with pytest.raises(ValueError, match=r"token_id_threshold=100000 is at or past the last id \(49151\)"):
        connect(tmp_path, tiny_model, [Gibberish(token_id_threshold=100_000, vocab_size=151_936)])


def test_default_gibberish_flags_rollouts_of_the_tiny_model_in_a_fit(tmp_path, tiny_model):
    # logprob_offset -8: a token past id 36_864 sampled below e^8 / 49_152 (6%) counts. The random tiny model
    # samples near-uniformly (logprob ~ -10.8), so about a quarter of its tokens qualify.
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "g",
        "--data.filters",
        json.dumps([{"class_path": "Gibberish", "init_args": {"logprob_offset": -8.0}}]),
        "--data.eval",
        "null",
        "--trainer.max_steps",
        "2",
        "--ckpt.interval",
        "0",
    )
    assert main(argv) == 0
    rows = read_metrics(tmp_path / "g", "filter/gibberish")
    assert len(rows) == 2 and sum(float(r["filter/gibberish"]) for r in rows) > 0
