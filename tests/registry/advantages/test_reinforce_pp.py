"""ReinforcePP against float64 hand computations."""

import math

import pytest
import torch

from grpokit.registry.advantages.group_norm import GroupNorm
from grpokit.registry.advantages.reinforce_pp import ReinforcePP


def expect(adv, rows):
    """`adv` is float64 and equals the hand-computed rows to 1e-12."""
    torch.testing.assert_close(adv, torch.tensor(rows, dtype=torch.float64), rtol=0, atol=1e-12)


def test_hand_computed_with_group_mean():
    rewards = torch.tensor([[0.0, 1.0], [2.0, 6.0], [0.1, 0.1]], dtype=torch.float64)
    adv = ReinforcePP(eps=0.0)(rewards, torch.ones_like(rewards))
    # centred: [-0.5, 0.5], [-2, 2], [0, 0]; batch mean 0; squares 0.25 + 0.25 + 4 + 4 + 0 + 0 = 8.5
    # over 6 rollouts (the flat group counts), so population std sqrt(8.5 / 6).
    s = math.sqrt(8.5 / 6)
    expect(adv[:2], [[-0.5 / s, 0.5 / s], [-2 / s, 2 / s]])
    assert torch.equal(adv[2], torch.zeros(2, dtype=torch.float64))
    assert adv.dtype == torch.float64


def test_hand_computed_without_group_mean():
    rewards = torch.tensor([[0.0, 1.0], [2.0, 6.0]], dtype=torch.float64)
    adv = ReinforcePP(subtract_group_mean=False, eps=0.0)(rewards, torch.ones_like(rewards))
    # batch mean 9/4 = 2.25; deviations -2.25, -1.25, -0.25, 3.75; squares 5.0625 + 1.5625 + 0.0625
    # + 14.0625 = 20.75, population std sqrt(20.75 / 4).
    s = math.sqrt(20.75 / 4)
    expect(adv, [[-2.25 / s, -1.25 / s], [-0.25 / s, 3.75 / s]])


def test_without_group_mean_a_flat_group_is_judged_against_the_batch():
    # By design (the baseline is the batch): mean 0.5, std 0.5 -> +1 for the all-1 group, -1 for the all-0.
    rewards = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    adv = ReinforcePP(subtract_group_mean=False, eps=0.0)(rewards, torch.ones_like(rewards))
    assert adv.tolist() == [[1.0, 1.0], [-1.0, -1.0]]


@pytest.mark.parametrize("subtract_group_mean", [True, False])
@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_all_equal_batch_gives_exactly_zero(subtract_group_mean, eps):
    rewards = torch.full((3, 3), 0.1, dtype=torch.float64)
    adv = ReinforcePP(subtract_group_mean=subtract_group_mean, eps=eps)(rewards, torch.ones_like(rewards))
    assert torch.equal(adv, torch.zeros_like(adv))


def test_single_group_matches_group_norm():
    # With one prompt the batch is the group: (r - mean) / (std + eps) either way.
    rewards = torch.tensor([[0.0, 1.0, 0.5, 0.25]], dtype=torch.float64)
    ones = torch.ones_like(rewards)
    assert torch.allclose(ReinforcePP()(rewards, ones), GroupNorm()(rewards, ones), atol=1e-12)


def test_batch_is_zero_mean_unit_std_and_dtype_kept():
    rewards = torch.rand(4, 8)
    adv = ReinforcePP(eps=0.0)(rewards, torch.ones_like(rewards))
    assert adv.dtype == torch.float32 and adv.shape == (4, 8)
    assert adv.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert adv.std(correction=0).item() == pytest.approx(1.0, abs=1e-5)
