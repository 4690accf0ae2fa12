"""DrGRPO against float64 hand computations."""

import torch

from grpokit.registry.advantages.dr_grpo import DrGRPO
from grpokit.registry.advantages.group_norm import GroupNorm


def expect(adv, rows):
    """`adv` is float64 and equals the hand-computed rows to 1e-12."""
    torch.testing.assert_close(adv, torch.tensor(rows, dtype=torch.float64), rtol=0, atol=1e-12)


def test_hand_computed_groups():
    rewards = torch.tensor([[0.0, 1.0, 0.5, 0.5], [1.0, 3.0, 1.0, 3.0]], dtype=torch.float64)
    adv = DrGRPO()(rewards, torch.ones_like(rewards))
    # group 0: mean (0 + 1 + 0.5 + 0.5) / 4 = 0.5; group 1: mean 8 / 4 = 2; no std division.
    expect(adv, [[-0.5, 0.5, 0.0, 0.0], [-1.0, 1.0, -1.0, 1.0]])
    assert adv.dtype == torch.float64 and adv.shape == rewards.shape


def test_single_group_of_two():
    rewards = torch.tensor([[0.2, 1.0]], dtype=torch.float64)
    # mean 0.6: 0.2 - 0.6 = -0.4, 1.0 - 0.6 = 0.4.
    expect(DrGRPO()(rewards, torch.ones_like(rewards)), [[-0.4, 0.4]])


def test_equal_rewards_give_exactly_zero():
    # 0.1 * 3 / 3 rounds to 0.1 + 1.4e-17 in float64; the contract still wants 0.
    rewards = torch.tensor([[0.1, 0.1, 0.1], [0.0, 1.0, 1.0]], dtype=torch.float64)
    adv = DrGRPO()(rewards, torch.ones_like(rewards))
    assert torch.equal(adv[0], torch.zeros(3, dtype=torch.float64))


def test_float32_in_float32_out_and_matches_group_norm_without_scale():
    rewards = torch.rand(4, 6)
    adv = DrGRPO()(rewards, torch.ones_like(rewards))
    assert adv.dtype == torch.float32 and adv.shape == (4, 6)
    assert torch.equal(adv, GroupNorm(scale="none")(rewards, torch.ones_like(rewards)))
