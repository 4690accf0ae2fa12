"""CISPO against float64 hand computations."""

import math

import pytest
import torch

from grpokit.registry.losses.cispo import CISPO
from grpokit.registry.losses.clipped_pg import ClippedPG
from grpokit.testing import loss_and_grad, make_loss_inputs


def make_inputs(trainer, infer, adv, mask=None, **kw):
    return make_loss_inputs(trainer, infer, adv, mask=mask, **kw)


grad_of = loss_and_grad


# ratios 1, 6 (capped at 1 + 4 = 5), 0.1 (no lower clip by default), 2
TRAINER = [-1.0, -2.0, -0.5, -3.0]
INFER = [-1.0, -2.0 - math.log(6), -0.5 - math.log(0.1), -3.0 - math.log(2)]
ADV = [1.0, 1.0, -1.0, 0.5]


def test_hand_computed_loss_and_gradient():
    loss, metrics, grad = grad_of(CISPO(), make_inputs(TRAINER, INFER, ADV))
    # -sum w A logp / 4 = -(1*1*-1 + 5*1*-2 + 0.1*-1*-0.5 + 2*0.5*-3) / 4 = 13.95 / 4
    assert loss.item() == pytest.approx(13.95 / 4, abs=1e-12)
    assert grad == pytest.approx([-1 / 4, -5 / 4, 0.1 / 4, -1 / 4], abs=1e-12)  # -w A / 4
    assert metrics["clipped_frac"].item() == pytest.approx(1 / 4)
    assert metrics["is_weight"].item() == pytest.approx((1 + 5 + 0.1 + 2) / 4)


def test_lower_clip_when_asked():
    _, metrics, grad = grad_of(CISPO(eps_low=0.2, eps_high=0.28), make_inputs(TRAINER, INFER, ADV))
    # weights 1, 1.28, 0.8, 1.28
    assert grad == pytest.approx([-1 / 4, -1.28 / 4, 0.8 / 4, -0.64 / 4], abs=1e-12)
    assert metrics["clipped_frac"].item() == pytest.approx(3 / 4)


def test_no_token_is_dropped_where_ppo_clip_drops_it():
    # ratio 1.5 with A > 0: PPO's clip gives no gradient, CISPO a gradient weighted by min(1.5, 1 + eps_high).
    x = [-1.0], [-1.0 - math.log(1.5)], [1.0]
    assert grad_of(ClippedPG(), make_inputs(*x))[2] == [0.0]
    assert grad_of(CISPO(eps_high=0.28), make_inputs(*x))[2] == pytest.approx([-1.28], abs=1e-12)


def test_all_tokens_masked_single_token_and_zero_advantages():
    loss, metrics, grad = grad_of(CISPO(), make_inputs([-1.0, -2.0], [0.0, 0.0], [1.0, 1.0], mask=[0, 0]))
    assert loss.item() == 0.0 and grad == [0.0, 0.0] and all(torch.isfinite(v) for v in metrics.values())
    _, _, grad = grad_of(CISPO(), make_inputs([-0.5], [-0.5], [2.0], loss_normalizer=8.0))
    assert grad == pytest.approx([-2 / 8], abs=1e-12)
    loss, _, grad = grad_of(CISPO(), make_inputs([-1.0, -2.0], [-1.5, -1.0], [0.0, 0.0]))
    assert loss.item() == 0.0 and grad == [0.0, 0.0]


def test_negative_eps_is_rejected():
    with pytest.raises(ValueError, match="eps_low >= 0 and eps_high >= 0"):
        CISPO(eps_low=-1.0)
