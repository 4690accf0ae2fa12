"""Repetition at and around its window and probability threshold."""

import math

import pytest

from grpokit.registry.filters.repetition import Repetition
from grpokit.testing import check_component
from tests.support import make_rollout

HI = math.log(0.999)  # near-certain
LO = math.log(0.5)
AT = math.log(0.99)  # exactly the default threshold: not above it


def rollout(logprobs, mask=None):
    return make_rollout([7] * len(logprobs), logprobs=logprobs, mask=mask or None)


def test_window_boundary():
    f = Repetition(window=3)
    assert f.flag([rollout([HI] * 2), rollout([HI] * 3), rollout([LO] + [HI] * 3 + [LO])]) == [False, True, True]


def test_run_must_be_consecutive():
    f = Repetition(window=3)
    assert f.flag([rollout([HI, HI, LO, HI, HI])]) == [False]
    assert f.flag([rollout([HI, HI, LO, HI, HI, HI])]) == [True]


def test_probability_boundary_is_strict():
    f = Repetition(window=2)
    assert f.flag([rollout([HI, AT, HI]), rollout([AT, AT])]) == [False, False]
    assert f.flag([rollout([math.nextafter(AT, 0.0)] * 2), rollout([0.0, 0.0])]) == [True, True]  # 0.0: probability 1


def test_custom_threshold():
    f = Repetition(window=2, prob_threshold=0.5)
    # log(0.6) = -0.5108 > log(0.5) = -0.6931 > log(0.4) = -0.9163
    assert f.flag([rollout([math.log(0.6)] * 2), rollout([math.log(0.4)] * 2), rollout([math.log(0.6), LO])]) == [
        True,
        False,
        False,
    ]


def test_environment_tokens_neither_extend_nor_break_a_run():
    f = Repetition(window=3)
    assert f.flag([rollout([HI, HI, HI], mask=[1, 0, 1])]) == [False]
    assert f.flag([rollout([HI, LO, HI, HI], mask=[1, 0, 1, 1])]) == [True]


def test_default_window_is_3000():
    f = Repetition()
    assert (f.window, f.prob_threshold) == (3000, 0.99)
    assert f.flag([rollout([HI] * 2999), rollout([HI] * 3000), rollout([HI] * 1500 + [LO] + [HI] * 1500)]) == [
        False,
        True,
        False,
    ]


def test_empty_completions_and_batch():
    f = Repetition(window=1)
    assert f.flag([]) == []
    assert f.flag([rollout([]), rollout([HI]), rollout([LO])]) == [False, True, False]


def test_enforce_is_kept():
    assert Repetition().enforce is True
    assert Repetition(enforce=False).enforce is False
    assert Repetition().name == "repetition"


def test_arguments_are_validated():
    with pytest.raises(ValueError, match="window"):
        Repetition(window=0)
    for p in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="prob_threshold"):
            Repetition(prob_threshold=p)


def test_contract():
    check_component(Repetition)
