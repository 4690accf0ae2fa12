"""LengthWeightedMean against float64 hand computations."""

import pytest
import torch

from grpokit.registry.advantages.dr_grpo import DrGRPO
from grpokit.registry.advantages.length_weighted_mean import LengthWeightedMean


def expect(adv, rows):
    """`adv` is float64 and equals the hand-computed rows to 1e-12."""
    torch.testing.assert_close(adv, torch.tensor(rows, dtype=torch.float64), rtol=0, atol=1e-12)


def test_hand_computed_group():
    rewards = torch.tensor([[1.0, 0.0, 0.5]], dtype=torch.float64)
    lengths = torch.tensor([[2.0, 6.0, 4.0]], dtype=torch.float64)
    adv = LengthWeightedMean()(rewards, lengths)
    # b = (2 * 1 + 6 * 0 + 4 * 0.5) / (2 + 6 + 4) = 4 / 12 = 1/3 -> A = 2/3, -1/3, 1/6.
    expect(adv, [[2 / 3, -1 / 3, 1 / 6]])
    # token-weighted sum: 2 * 2/3 + 6 * (-1/3) + 4 * 1/6 = 4/3 - 2 + 2/3 = 0
    assert (lengths * adv).sum().item() == pytest.approx(0.0, abs=1e-12)


def test_equal_lengths_give_the_plain_mean():
    rewards = torch.rand(3, 5, dtype=torch.float64)
    lengths = torch.full((3, 5), 7.0, dtype=torch.float64)
    assert torch.allclose(LengthWeightedMean()(rewards, lengths), DrGRPO()(rewards, lengths), atol=1e-12)


def test_single_group_of_two():
    rewards = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    lengths = torch.tensor([[3.0, 1.0]], dtype=torch.float64)
    # b = (3 * 0 + 1 * 1) / 4 = 0.25 -> A = -0.25, 0.75.
    expect(LengthWeightedMean()(rewards, lengths), [[-0.25, 0.75]])


def test_zero_length_rollout_does_not_move_the_baseline():
    rewards = torch.tensor([[1.0, 0.0, 0.5]], dtype=torch.float64)
    lengths = torch.tensor([[0.0, 3.0, 1.0]], dtype=torch.float64)
    # b = (0 * 1 + 3 * 0 + 1 * 0.5) / 4 = 0.125 -> A = 0.875, -0.125, 0.375.
    expect(LengthWeightedMean()(rewards, lengths), [[0.875, -0.125, 0.375]])


def test_all_zero_lengths_fall_back_to_the_plain_mean():
    rewards = torch.tensor([[1.0, 0.0, 0.5], [1.0, 0.0, 0.5]], dtype=torch.float64)
    lengths = torch.tensor([[0.0, 0.0, 0.0], [2.0, 6.0, 4.0]], dtype=torch.float64)
    adv = LengthWeightedMean()(rewards, lengths)
    # group 0: no tokens, b = 1.5 / 3 = 0.5 -> 0.5, -0.5, 0; group 1 as in test_hand_computed_group.
    expect(adv, [[0.5, -0.5, 0.0], [2 / 3, -1 / 3, 1 / 6]])


def test_equal_rewards_give_exactly_zero():
    # (3 + 7 + 11) * 0.1 / 21 rounds away from 0.1 in float64; the contract still wants 0.
    rewards = torch.tensor([[0.1, 0.1, 0.1], [0.7, 0.7, 0.7]], dtype=torch.float64)
    lengths = torch.tensor([[3.0, 7.0, 11.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    adv = LengthWeightedMean()(rewards, lengths)
    assert torch.equal(adv, torch.zeros_like(adv))


def test_integer_lengths_and_float32_rewards_give_float32():
    rewards = torch.rand(2, 4)
    lengths = torch.randint(0, 50, (2, 4))
    adv = LengthWeightedMean()(rewards, lengths)
    assert adv.dtype == torch.float32 and adv.shape == (2, 4) and torch.isfinite(adv).all()
