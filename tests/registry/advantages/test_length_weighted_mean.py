"""LengthWeightedMean against float64 hand computations."""

import pytest
import torch

from grpokit.registry.advantages.dr_grpo import DrGRPO
from grpokit.registry.advantages.length_weighted_mean import LengthWeightedMean
from tests.support import make_rollout


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


def test_a_multi_turn_rollout_weighs_only_its_trained_tokens():
    # A: 2 reply tokens, a 4-token tool result (mask 0), 1 reply token; B: 3 reply tokens; C: 1 + 2 env + 1.
    a = make_rollout([5, 6, 90, 91, 92, 93, 7], mask=[1, 1, 0, 0, 0, 0, 1], reward=1.0)
    b = make_rollout([5, 6, 7], reward=0.0)
    c = make_rollout([5, 90, 91, 7], mask=[1, 0, 0, 1], reward=0.5)
    per_token = LengthWeightedMean().token_advantages([[a, b, c]])
    # trained tokens 3, 3, 2: b = (3 * 1 + 3 * 0 + 2 * 0.5) / 8 = 1/2 -> A = 1/2, -1/2, 0.
    # (counting every completion token, 7, 3, 4, gave b = (7 + 2) / 14 = 9/14 -> 5/14, -9/14, -1/7.)
    assert per_token == [[0.5] * 7, [-0.5] * 3, [0.0] * 4]
    trained = [sum(r.completion_mask) for r in (a, b, c)]
    assert sum(n * adv[0] for n, adv in zip(trained, per_token)) == 0.0  # cancels over the trained tokens


def test_single_turn_rollouts_weigh_their_whole_completion_as_before():
    rewards, lengths = [1.0, 0.0, 0.5], [2, 6, 4]
    group = [make_rollout(list(range(n)), reward=r) for r, n in zip(rewards, lengths)]
    per_token = LengthWeightedMean().token_advantages([group])
    expected = LengthWeightedMean()(
        torch.tensor([rewards], dtype=torch.float64), torch.tensor([lengths], dtype=torch.float64)
    )
    assert per_token == [[a] * n for a, n in zip(expected[0].tolist(), lengths)]
    expect(torch.tensor([adv[0] for adv in per_token], dtype=torch.float64)[None], [[2 / 3, -1 / 3, 1 / 6]])
