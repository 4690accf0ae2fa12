"""GroupNorm against float64 hand computations."""

import math

import pytest
import torch
from jsonargparse import ArgumentParser

from grpokit.advantage import Advantage
from grpokit.registry.advantages.group_norm import GroupNorm


def expect(adv, rows):
    """`adv` is float64 and equals the hand-computed rows to 1e-12."""
    torch.testing.assert_close(adv, torch.tensor(rows, dtype=torch.float64), rtol=0, atol=1e-12)


REWARDS = [[0.0, 1.0, 0.5, 0.5], [1.0, 3.0, 1.0, 3.0]]


def test_hand_computed_group():
    rewards = torch.tensor(REWARDS, dtype=torch.float64)
    adv = GroupNorm(eps=0.0)(rewards, torch.ones_like(rewards))
    # group 0: mean 0.5, population std sqrt(0.125); group 1: mean 2, std 1.
    s = math.sqrt(0.125)
    assert adv[0].tolist() == pytest.approx([-0.5 / s, 0.5 / s, 0.0, 0.0], abs=1e-12)
    assert adv[1].tolist() == pytest.approx([-1.0, 1.0, -1.0, 1.0], abs=1e-12)
    assert adv.dtype == torch.float64


def test_hand_computed_batch_scale():
    rewards = torch.tensor(REWARDS, dtype=torch.float64)
    adv = GroupNorm(eps=0.0, scale="batch")(rewards, torch.ones_like(rewards))
    # all 8 rewards: mean 10/8 = 1.25; squared deviations 1.5625 + 0.0625 + 0.5625 + 0.5625
    # + 0.0625 + 3.0625 + 0.0625 + 3.0625 = 9, so population std sqrt(9/8); group means 0.5 and 2 as above.
    s = math.sqrt(9 / 8)
    assert adv[0].tolist() == pytest.approx([-0.5 / s, 0.5 / s, 0.0, 0.0], abs=1e-12)
    assert adv[1].tolist() == pytest.approx([-1 / s, 1 / s, -1 / s, 1 / s], abs=1e-12)


def test_no_scale_is_centering_only():
    rewards = torch.tensor(REWARDS, dtype=torch.float64)
    adv = GroupNorm(scale="none")(rewards, torch.ones_like(rewards))
    # r - group mean: group 0 mean 0.5, group 1 mean 2.
    expect(adv, [[-0.5, 0.5, 0.0, 0.0], [-1.0, 1.0, -1.0, 1.0]])


def test_single_group_of_two():
    rewards = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    # mean 0.5, population std 0.5 -> (r - 0.5) / 0.5 = -1, +1.
    assert GroupNorm(eps=0.0)(rewards, torch.ones_like(rewards)).tolist() == [[-1.0, 1.0]]


def test_equal_rewards_give_zero_advantage():
    rewards = torch.full((3, 4), 0.7, dtype=torch.float64)
    adv = GroupNorm()(rewards, torch.ones_like(rewards))
    assert torch.equal(adv, torch.zeros_like(adv))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_equal_rewards_are_exactly_zero_despite_rounding(scale, eps):
    # 0.1 * 3 / 3 != 0.1 in float64: r - mean leaves 1.4e-17, which / std with eps = 0 used to give -1.
    # Row 1 keeps the batch std nonzero; row 2 is a flat group whose mean rounds exactly (0/0 with eps 0).
    rewards = torch.tensor([[0.1, 0.1, 0.1], [0.0, 1.0, 0.5], [0.7, 0.7, 0.7]], dtype=torch.float64)
    adv = GroupNorm(eps=eps, scale=scale)(rewards, torch.ones_like(rewards))
    assert torch.equal(adv[0], torch.zeros(3, dtype=torch.float64))
    assert torch.equal(adv[2], torch.zeros(3, dtype=torch.float64))
    assert torch.isfinite(adv).all() and adv[1].abs().sum() > 0


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_all_equal_batch_is_zero_not_nan(scale):
    rewards = torch.full((2, 3), 0.1, dtype=torch.float32)
    adv = GroupNorm(eps=0.0, scale=scale)(rewards, torch.ones_like(rewards))
    assert torch.equal(adv, torch.zeros_like(adv)) and adv.dtype == torch.float32


def test_groups_are_independent_and_sum_to_zero():
    rewards = torch.rand(5, 8, dtype=torch.float64)
    adv = GroupNorm()(rewards, torch.ones_like(rewards))
    assert torch.allclose(adv.sum(-1), torch.zeros(5, dtype=torch.float64), atol=1e-9)
    single = GroupNorm()(rewards[2:3], torch.ones(1, 8))
    assert torch.allclose(adv[2:3], single)


def test_unknown_scale_is_refused():
    with pytest.raises(ValueError, match="scale"):
        GroupNorm(scale="prompt")


def test_recipe_selects_scale_and_rejects_unknown_values():
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(Advantage, "advantage")
    config = parser.parse_object({"advantage": {"class_path": "GroupNorm", "init_args": {"scale": "batch"}}})
    advantage = parser.instantiate_classes(config).advantage
    assert isinstance(advantage, GroupNorm) and advantage.scale == "batch"
    with pytest.raises(Exception, match="scale"):
        parser.parse_object({"advantage": {"class_path": "GroupNorm", "init_args": {"scale": "prompt"}}})
