"""GroupNorm against float64 hand computations."""

import math

import pytest
import torch

from grpokit.registry.advantages.group_norm import GroupNorm


def test_hand_computed_group():
    rewards = torch.tensor([[0.0, 1.0, 0.5, 0.5], [1.0, 3.0, 1.0, 3.0]], dtype=torch.float64)
    adv = GroupNorm(eps=0.0)(rewards, torch.ones_like(rewards))
    # group 0: mean 0.5, population std sqrt(0.125); group 1: mean 2, std 1.
    s = math.sqrt(0.125)
    assert adv[0].tolist() == pytest.approx([-0.5 / s, 0.5 / s, 0.0, 0.0], abs=1e-12)
    assert adv[1].tolist() == pytest.approx([-1.0, 1.0, -1.0, 1.0], abs=1e-12)
    assert adv.dtype == torch.float64


def test_equal_rewards_give_zero_advantage():
    rewards = torch.full((3, 4), 0.7, dtype=torch.float64)
    adv = GroupNorm()(rewards, torch.ones_like(rewards))
    assert torch.equal(adv, torch.zeros_like(adv))


def test_groups_are_independent_and_sum_to_zero():
    rewards = torch.rand(5, 8, dtype=torch.float64)
    adv = GroupNorm()(rewards, torch.ones_like(rewards))
    assert torch.allclose(adv.sum(-1), torch.zeros(5, dtype=torch.float64), atol=1e-9)
    single = GroupNorm()(rewards[2:3], torch.ones(1, 8))
    assert torch.allclose(adv[2:3], single)
