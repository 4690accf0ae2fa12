"""ZeroStd on hand-built groups: exact equality, interleaved groups, singletons."""

import math

from grpokit.registry.filters.zero_std import ZeroStd
from grpokit.testing import check_component
from tests.support import make_rollout


def rollout(group_id, reward, n=2):
    return make_rollout([7] * n, logprobs=[-0.1] * n, reward=reward, group_id=group_id)


def test_flags_every_rollout_of_a_flat_group():
    f = ZeroStd()
    rollouts = [rollout(0, 1.0), rollout(0, 1.0), rollout(0, 1.0), rollout(1, 0.0), rollout(1, 1.0), rollout(1, 0.0)]
    assert f.flag(rollouts) == [True, True, True, False, False, False]


def test_groups_may_be_interleaved():
    f = ZeroStd()
    assert f.flag([rollout(0, 0.5), rollout(1, 0.0), rollout(0, 0.5), rollout(1, 1.0)]) == [True, False, True, False]


def test_equality_is_exact():
    f = ZeroStd()
    # mean of three 0.1s is not exactly 0.1 in float64, but the rewards are equal: flagged.
    assert f.flag([rollout(0, 0.1)] * 3) == [True] * 3
    assert f.flag([rollout(0, 0.1), rollout(0, math.nextafter(0.1, 1.0))]) == [False, False]
    assert f.flag([rollout(0, 0.0), rollout(0, -0.0)]) == [True, True]


def test_single_rollout_group_and_empty_completions():
    f = ZeroStd()
    assert f.flag([]) == []
    assert f.flag([rollout(3, 0.7, n=0)]) == [True]
    assert f.flag([rollout(0, 0.0, n=0), rollout(0, 1.0, n=0)]) == [False, False]


def test_enforce_defaults_to_monitoring_and_is_kept():
    assert ZeroStd().enforce is False
    assert ZeroStd(enforce=True).enforce is True
    assert ZeroStd().name == "zerostd"


def test_contract():
    check_component(ZeroStd)
