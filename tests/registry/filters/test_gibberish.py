"""Gibberish at and around both thresholds, with hand-computed threshold values."""

import math

import pytest

from grpokit.registry.filters.gibberish import Gibberish
from grpokit.testing import StubTokenizer, check_component
from tests.support import make_rollout

# Qwen: 151_936 = 2^7 * 1187: -log(151_936) - 2 = -(7 ln 2 + ln 1187) - 2 = -(4.852030 + 7.079184) - 2 = -13.931215
DEFAULT_THRESHOLD = -13.931215


def rollout(ids, logprobs, mask=None):
    return make_rollout(ids, logprobs=logprobs, mask=mask or None)


def qwen(**kw):
    """prime-rl's published setting for Qwen2/2.5/3 (151_936 embedding rows)."""
    return Gibberish(token_id_threshold=100_000, vocab_size=151_936, **kw)


def test_qwen_threshold_is_uniform_logprob_minus_offset():
    g = qwen()
    assert (g.token_id_threshold, g.vocab_size, g.logprob_offset) == (100_000, 151_936, 2.0)
    assert g.logprob_threshold == pytest.approx(DEFAULT_THRESHOLD, abs=1e-6)


def test_token_id_boundary_is_strict():
    g = qwen()
    # logprob -20 is far below the threshold, so only the id decides: 100_000 is not > 100_000.
    assert g.flag([rollout([100_000], [-20.0]), rollout([100_001], [-20.0])]) == [False, True]


def test_logprob_boundary_is_strict():
    g = qwen()
    at = g.logprob_threshold
    below = math.nextafter(at, -math.inf)
    cases = [
        rollout([120_000], [at]),
        rollout([120_000], [below]),
        rollout([120_000], [-13.9]),
        rollout([120_000], [-14.0]),
    ]
    assert g.flag(cases) == [False, True, False, True]


def test_both_conditions_must_hold_on_the_same_token():
    g = qwen()
    # token 1: rare but probable; token 2: improbable but common.
    assert g.flag([rollout([50, 120_000, 80], [-0.1, -1.0, -30.0])]) == [False]
    assert g.flag([rollout([50, 120_000, 80], [-0.1, -15.0, -0.5])]) == [True]


def test_environment_tokens_are_not_checked():
    g = qwen()
    assert g.flag([rollout([50, 120_000], [-0.1, -20.0], mask=[1, 0])]) == [False]
    assert g.flag([rollout([50, 120_000], [-0.1, -20.0], mask=[0, 1])]) == [True]


def test_other_tokenizer_and_offset():
    # SmolLM2: 49_152 = 3 * 2^14: -log(49_152) - 0.5 = -(1.098612 + 9.704061) - 0.5 = -11.302673.
    g = Gibberish(token_id_threshold=36_864, vocab_size=49_152, logprob_offset=0.5)
    assert g.logprob_threshold == pytest.approx(-11.302673, abs=1e-6)
    assert g.flag([rollout([36_865], [-11.31]), rollout([36_865], [-11.29]), rollout([36_864], [-30.0])]) == [
        True,
        False,
        False,
    ]


def test_empty_completions_and_batch():
    g = qwen()
    assert g.flag([]) == []
    assert g.flag([rollout([], []), rollout([120_000], [-20.0]), rollout([], [])]) == [False, True, False]


def test_enforce_is_kept():
    assert qwen().enforce is True
    assert qwen(enforce=False).enforce is False
    assert Gibberish().name == "gibberish"


def test_arguments_are_validated():
    with pytest.raises(ValueError, match="token_id_threshold"):
        Gibberish(token_id_threshold=151_935, vocab_size=151_936)
    with pytest.raises(ValueError, match="token_id_threshold"):
        Gibberish(token_id_threshold=100_000, vocab_size=32_000)
    with pytest.raises(ValueError, match="token_id_threshold"):
        Gibberish(token_id_threshold=-1)
    with pytest.raises(ValueError, match="vocab_size"):
        Gibberish(vocab_size=1, token_id_threshold=0)
    Gibberish(token_id_threshold=151_934, vocab_size=151_936)  # id 151_935 (the last row) can still exceed it


def test_defaults_follow_the_connected_tokenizer():
    # SmolLM2: 49_152 = 3 * 2^14: -log(49_152) - 2 = -(1.098612 + 9.704061) - 2 = -12.802673;
    # threshold int(0.75 * 49_152) = 36_864.
    g = Gibberish()
    g.connect(StubTokenizer(49_152))
    assert (g.token_id_threshold, g.vocab_size) == (36_864, 49_152)
    assert g.logprob_threshold == pytest.approx(-12.802673, abs=1e-6)
    cases = [rollout([36_865], [-12.81]), rollout([36_865], [-12.79]), rollout([36_864], [-30.0])]
    assert g.flag(cases) == [True, False, False]


def test_explicit_values_are_kept_when_connected():
    g = Gibberish(vocab_size=151_936)  # Qwen's padded embedding, tokenizer 151_665
    g.connect(StubTokenizer(151_665))
    assert (g.token_id_threshold, g.vocab_size) == (113_952, 151_936)
    g = Gibberish(token_id_threshold=40_000)
    g.connect(StubTokenizer(49_152))
    assert (g.token_id_threshold, g.vocab_size) == (40_000, 49_152)


def test_a_threshold_no_id_of_the_tokenizer_exceeds_is_refused_at_connect():
    with pytest.raises(
        ValueError, match=r"data.filters Gibberish: token_id_threshold=100000 is at or past the last id \(49151\)"
    ):
        qwen().connect(StubTokenizer(49_152))


def test_flag_before_connect_without_vocab_size_is_an_error():
    with pytest.raises(RuntimeError, match="Gibberish has no vocab_size"):
        Gibberish().flag([rollout([1], [-1.0])])


def test_contract():
    check_component(Gibberish)
