"""AIPO against float64 hand computations."""

import math

import pytest
import torch

from grpokit.loss import LossInputs
from grpokit.registry.losses.aipo import AIPO


def inputs(trainer, infer, adv, mask, seq_ids, normalizer=None):
    t = torch.tensor(trainer, dtype=torch.float64, requires_grad=True)
    mask_t = torch.tensor(mask, dtype=torch.float64)
    return LossInputs(
        trainer_logprobs_T=t,
        inference_logprobs_T=torch.tensor(infer, dtype=torch.float64),
        advantages_T=torch.tensor(adv, dtype=torch.float64),
        loss_mask_T=mask_t,
        seq_ids_T=torch.tensor(seq_ids),
        num_seqs=max(seq_ids) + 1,
        loss_normalizer=float(normalizer if normalizer is not None else mask_t.sum()),
    )


def test_hand_computed_loss_gradient_and_token_mask():
    # seq 0: ratios 1 and 2, A = 0.5; seq 1: ratio 9 (> token_mask_high 8: masked; < geo_mask_high 10), A = -1.
    x = inputs(
        trainer=[-1.0, -2.0, -0.5],
        infer=[-1.0, -2.0 - math.log(2), -0.5 - math.log(9)],
        adv=[0.5, 0.5, -1.0], mask=[1, 1, 1], seq_ids=[0, 0, 1],
    )
    loss, metrics = AIPO(kl_tau=0.1)(x)
    coeff1 = 2 * (0.5 - 0.1 * math.log(2))
    expected = (0.5 * 1.0 + coeff1 * 2.0) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    loss.backward()
    assert x.trainer_logprobs_T.grad.tolist() == pytest.approx([-0.5 / 3, -coeff1 / 3, 0.0], abs=1e-12)
    assert metrics["masked_frac"].item() == pytest.approx(1 / 3)
    assert metrics["token_masked_frac"].item() == pytest.approx(1 / 3)
    assert metrics["seq_masked_frac"].item() == 0.0


def test_geometric_mask_drops_whole_sequence():
    # seq 0: two tokens of ratio 4 each -> geometric mean 4 > geo_mask_high 3; seq 1 on-policy.
    x = inputs(
        trainer=[-1.0, -1.0, -2.0], infer=[-1.0 - math.log(4), -1.0 - math.log(4), -2.0],
        adv=[1.0, 1.0, 2.0], mask=[1, 1, 1], seq_ids=[0, 0, 1],
    )
    loss, metrics = AIPO(geo_mask_high=3.0)(x)
    assert loss.item() == pytest.approx(-(2.0 * -2.0) / 3, abs=1e-12)
    assert metrics["seq_masked_frac"].item() == pytest.approx(2 / 3)


def test_low_token_mask_and_loss_mask():
    # token 0 is a prompt token (mask 0); token 1 has ratio 1/16 < 0.125 -> masked; token 2 kept.
    x = inputs(trainer=[-3.0, -1.0, -1.5], infer=[-0.1, -1.0 + math.log(16), -1.5], adv=[9.0, 1.0, 1.0], mask=[0, 1, 1], seq_ids=[0, 0, 0])
    loss, metrics = AIPO()(x)
    assert loss.item() == pytest.approx(-(1.0 * -1.5) / 2, abs=1e-12)
    assert metrics["masked_frac"].item() == pytest.approx(0.5)


def test_on_policy_gradient_is_advantage_over_normalizer():
    x = inputs(trainer=[-0.7, -1.2, -0.3, -2.0], infer=[-0.7, -1.2, -0.3, -2.0], adv=[2.0, 2.0, -1.0, -1.0], mask=[1, 1, 1, 1], seq_ids=[0, 0, 1, 1], normalizer=8)
    loss, _ = AIPO()(x)
    loss.backward()
    assert x.trainer_logprobs_T.grad.tolist() == pytest.approx([-2 / 8, -2 / 8, 1 / 8, 1 / 8], abs=1e-12)


def test_all_tokens_masked_gives_zero_loss_not_nan():
    x = inputs(trainer=[-1.0, -1.0], infer=[-1.0, -1.0], adv=[1.0, 1.0], mask=[0, 0], seq_ids=[0, 0], normalizer=1)
    loss, metrics = AIPO()(x)
    assert loss.item() == 0.0 and torch.isfinite(metrics["masked_frac"])


def test_bad_bounds_are_rejected_with_the_key_names():
    with pytest.raises(ValueError, match="token_mask_low <= 1 <= token_mask_high"):
        AIPO(token_mask_high=0.5)
