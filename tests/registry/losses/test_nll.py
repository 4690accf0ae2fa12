"""NLL against float64 hand computations: the token mean over the step, the mask, the contract."""

import pytest

from grpokit.registry.losses.nll import NLL
from grpokit.testing import check_loss, loss_and_grad, make_loss_inputs

pytestmark = pytest.mark.unit


def test_token_mean_over_the_step_with_masked_tokens_ignored():
    # loss tokens -1 and -3 (the -2 is a user token, mask 0); the step holds 4 loss tokens in all:
    # L = -(-1 + -3) / 4 = 1.0, dL/dlogp = -1/4 on loss tokens, 0 on the masked one; nll = 4 / 2 = 2.0.
    inputs = make_loss_inputs([-1.0, -2.0, -3.0], [0.0] * 3, [5.0] * 3, mask=[1, 0, 1], loss_normalizer=4.0)
    loss, metrics, grad = loss_and_grad(NLL(), inputs)
    assert loss.item() == pytest.approx(1.0, abs=1e-15)
    assert grad == pytest.approx([-0.25, 0.0, -0.25], abs=1e-15)
    assert metrics["nll"].item() == pytest.approx(2.0, abs=1e-15)


def test_advantages_and_engine_logprobs_do_not_matter():
    a = make_loss_inputs([-1.0, -2.0], [0.0, 0.0], [0.0, 0.0])
    b = make_loss_inputs([-1.0, -2.0], [-9.0, 3.0], [7.0, -7.0])
    assert NLL()(a)[0].item() == NLL()(b)[0].item() == pytest.approx(1.5, abs=1e-15)


def test_meets_the_loss_contract():
    check_loss(NLL())
