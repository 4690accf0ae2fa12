"""KL estimators k1, k2, k3 against float64 hand computations and exact expectations."""

import math

import pytest
import torch

from grpokit.kl import ESTIMATORS, k1, k2, k3


def test_hand_case():
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    logq = torch.tensor([-1.5, -1.0, -0.5], dtype=torch.float64)
    # logp - logq = [0.5, -1, 0]; log r = logq - logp = [-0.5, 1, 0]
    assert k1(logp, logq).tolist() == pytest.approx([0.5, -1.0, 0.0], abs=1e-12)
    assert k2(logp, logq).tolist() == pytest.approx([0.125, 0.5, 0.0], abs=1e-12)
    # k3 = exp(log r) - log r - 1: e^-0.5 + 0.5 - 1, e - 1 - 1, 0
    assert k3(logp, logq).tolist() == pytest.approx([math.exp(-0.5) - 0.5, math.e - 2, 0.0], abs=1e-12)
    assert set(ESTIMATORS) == {"k1", "k2", "k3"}


def test_k3_is_never_negative():
    torch.manual_seed(0)
    logp, logq = 5 * torch.randn(1000, dtype=torch.float64), 5 * torch.randn(1000, dtype=torch.float64)
    assert (k3(logp, logq) >= 0).all()
    assert (k1(logp, logq) < 0).any()


def distributions():
    theta = torch.tensor([0.3, -1.0, 0.8, 0.0], dtype=torch.float64, requires_grad=True)
    logp = torch.log_softmax(theta, -1)
    logq = torch.log_softmax(torch.tensor([0.0, 0.5, -0.2, 1.0], dtype=torch.float64), -1)
    return theta, logp, logq


def test_k1_and_k3_are_unbiased_for_kl_p_q():
    # Exact expectation over the 4 outcomes, sampled from p.
    _, logp, logq = distributions()
    p = logp.exp().detach()
    kl_pq = (p * (logp - logq)).sum()
    assert (p * k1(logp, logq)).sum().item() == pytest.approx(kl_pq.item(), abs=1e-12)
    assert (p * k3(logp, logq)).sum().item() == pytest.approx(kl_pq.item(), abs=1e-12)


def test_gradients_as_losses_k2_gives_reverse_kl_k3_gives_forward_kl():
    # Expected gradient with the sampling distribution held fixed, against the true KL gradients.
    def grad(f):
        theta, logp, logq = distributions()
        f(logp, logq).backward()
        return theta.grad

    def expected(est):
        return lambda logp, logq: (logp.exp().detach() * est(logp, logq)).sum()

    reverse = grad(lambda logp, logq: (logp.exp() * (logp - logq)).sum())  # grad KL(p || q)
    forward = grad(lambda logp, logq: (logq.exp() * (logq - logp)).sum())  # grad KL(q || p)
    assert grad(expected(k2)).tolist() == pytest.approx(reverse.tolist(), abs=1e-12)
    assert grad(expected(k3)).tolist() == pytest.approx(forward.tolist(), abs=1e-12)
    assert grad(expected(k1)).tolist() == pytest.approx([0.0] * 4, abs=1e-12)
