"""LeaveOneOut against float64 hand computations, and its identities with DrGRPO."""

import pytest
import torch

from grpokit.registry.advantages.dr_grpo import DrGRPO
from grpokit.registry.advantages.leave_one_out import LeaveOneOut


def expect(adv, rows):
    """`adv` is float64 and equals the hand-computed rows to 1e-12."""
    torch.testing.assert_close(adv, torch.tensor(rows, dtype=torch.float64), rtol=0, atol=1e-12)


def test_hand_computed_groups():
    rewards = torch.tensor([[0.0, 1.0, 0.5, 0.5], [1.0, 3.0, 1.0, 3.0]], dtype=torch.float64)
    adv = LeaveOneOut()(rewards, torch.ones_like(rewards))
    # group 0: sum 2, baseline_i = (2 - r_i) / 3: 2/3, 1/3, 1/2, 1/2 -> A = -2/3, 2/3, 0, 0.
    # group 1: sum 8, baseline_i = (8 - r_i) / 3: 7/3, 5/3, 7/3, 5/3 -> A = -4/3, 4/3, -4/3, 4/3.
    assert adv[0].tolist() == pytest.approx([-2 / 3, 2 / 3, 0.0, 0.0], abs=1e-12)
    assert adv[1].tolist() == pytest.approx([-4 / 3, 4 / 3, -4 / 3, 4 / 3], abs=1e-12)
    assert adv.dtype == torch.float64


def test_single_group_of_two():
    rewards = torch.tensor([[0.2, 1.0]], dtype=torch.float64)
    # each baseline is the other reward: 0.2 - 1.0 = -0.8, 1.0 - 0.2 = 0.8.
    expect(LeaveOneOut()(rewards, torch.ones_like(rewards)), [[-0.8, 0.8]])


def test_one_rollout_per_prompt_is_refused():
    rewards = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="rollouts_per_example"):
        LeaveOneOut()(rewards, torch.ones_like(rewards))


def test_equal_rewards_give_exactly_zero():
    # (0.3 - 0.1) / 2 rounds to 0.1 + 1.4e-17 in float64; the contract still wants 0.
    rewards = torch.tensor([[0.1, 0.1, 0.1], [0.7, 0.7, 0.7]], dtype=torch.float64)
    adv = LeaveOneOut()(rewards, torch.ones_like(rewards))
    assert torch.equal(adv, torch.zeros_like(adv))


def test_group_advantages_sum_to_zero():
    rewards = torch.rand(5, 8, dtype=torch.float64)
    adv = LeaveOneOut()(rewards, torch.ones_like(rewards))
    # sum_i r_i - sum_i (S - r_i) / (G - 1) = S - (G S - S) / (G - 1) = 0
    assert torch.allclose(adv.sum(-1), torch.zeros(5, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("g", [2, 3, 8])
def test_is_dr_grpo_scaled_by_g_over_g_minus_one(g):
    # r_i - (S - r_i) / (G - 1) = (G r_i - S) / (G - 1) = G / (G - 1) * (r_i - S / G)
    rewards = torch.rand(4, g, dtype=torch.float64)
    ones = torch.ones_like(rewards)
    assert torch.allclose(LeaveOneOut()(rewards, ones), g / (g - 1) * DrGRPO()(rewards, ones), atol=1e-12)


def test_float32_in_float32_out():
    rewards = torch.rand(3, 4)
    adv = LeaveOneOut()(rewards, torch.ones_like(rewards))
    assert adv.dtype == torch.float32 and adv.shape == (3, 4)
