"""Mismatch metrics against float64 hand computations."""

import math

import pytest
import torch

from grpokit.trainer.metrics import mismatch_metrics, weighted_mean


def test_hand_computed_mismatch_metrics():
    # token 0: r = 2; token 1: r = 1/2; token 2 masked (ignored).
    train = torch.tensor([-1.0, -2.0, -9.0], dtype=torch.float64)
    infer = torch.tensor([-1.0 - math.log(2), -2.0 + math.log(2), -0.1], dtype=torch.float64)
    m = mismatch_metrics(train, infer, torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64))
    ln2 = math.log(2)
    # k3: (2 - 1 - ln2) + (0.5 - 1 + ln2) = 0.5  -> mean 0.25
    assert m["gen_kl_error"].item() == pytest.approx(0.25, abs=1e-12)
    assert m["kl"].item() == m["gen_kl_error"].item()
    # unbiased, 1 - r + r ln r: (1 - 2 + 2 ln2) + (1 - 0.5 - 0.5 ln2) = -0.5 + 1.5 ln2
    assert m["policy_kl_error_is"].item() == pytest.approx((-0.5 + 1.5 * ln2) / 2, abs=1e-12)

    def js(r):
        return 0.5 * math.log(2 / (1 + r)) + 0.5 * r * math.log(2 * r / (1 + r))

    assert m["js_divergence_error_is"].item() == pytest.approx((js(2) + js(0.5)) / 2, abs=1e-12)
    # NeMo's reverse k3, 1/r - 1 + ln r: (0.5 - 1 + ln2) + (2 - 1 - ln2) = 0.5
    assert m["policy_kl_error"].item() == pytest.approx(0.25, abs=1e-12)
    assert m["token_mult_prob_error"].item() == pytest.approx(2.0, abs=1e-12)  # exp(ln2) both tokens
    assert m["sampling_importance_ratio"].item() == pytest.approx(1.25, abs=1e-12)
    assert m["approx_entropy"].item() == pytest.approx((2 * 1.0 + 0.5 * 2.0) / 2, abs=1e-12)


def test_identical_logprobs_give_zero_divergence():
    lp = -torch.rand(7, dtype=torch.float64)
    m = mismatch_metrics(lp, lp.clone(), torch.ones(7, dtype=torch.float64))
    for key in (
        "gen_kl_error",
        "policy_kl_error",
        "js_divergence_error",
        "policy_kl_error_is",
        "js_divergence_error_is",
    ):
        assert m[key].item() == pytest.approx(0.0, abs=1e-12)
    assert m["token_mult_prob_error"].item() == pytest.approx(1.0)


def test_empty_mask_is_finite():
    m = mismatch_metrics(torch.zeros(3), torch.zeros(3), torch.zeros(3))
    assert all(torch.isfinite(v) for v in m.values())


def test_weighted_mean_by_loss_tokens():
    out = weighted_mean([{"a": torch.tensor(1.0)}, {"a": torch.tensor(4.0)}], [3.0, 1.0])
    assert out["a"] == pytest.approx(7 / 4)


def test_weighted_mean_counts_only_the_micro_batches_reporting_a_metric():
    out = weighted_mean(
        [{"a": torch.tensor(1.0), "b": torch.tensor(2.0)}, {"a": torch.tensor(4.0)}, {"a": torch.tensor(0.0)}],
        [3.0, 1.0, 0.0],
    )
    assert out == pytest.approx({"a": 7 / 4, "b": 2.0})


def test_nemo_rl_worked_example():
    """NeMo RL's metric definitions on its worked example: the engine gives a token logprob -5, the
    trainer -15 (log r = -10). NeMo's own code gives policy_kl_error = e^10 - 11 = 22,015.47 and
    js_divergence_error = 4.3069 (the mixture M = (e^-15 + e^-5) / 2 per token)."""
    m = mismatch_metrics(torch.tensor([-15.0]), torch.tensor([-5.0]), torch.ones(1))
    assert m["gen_kl_error"].item() == pytest.approx(math.exp(-10) - 1 + 10, rel=1e-12)
    assert m["policy_kl_error"].item() == pytest.approx(math.exp(10) - 11, rel=1e-12)
    assert m["policy_kl_error"].item() == pytest.approx(22015.47, abs=0.01)
    log_m = math.log((math.exp(-15) + math.exp(-5)) / 2)

    def term(lp):
        return math.exp(lp - log_m) - (lp - log_m) - 1

    assert m["js_divergence_error"].item() == pytest.approx(0.5 * term(-15) + 0.5 * term(-5), rel=1e-12)
    assert m["js_divergence_error"].item() == pytest.approx(4.3069, abs=1e-4)
    # the importance-weighted estimators stay small where r is tiny: the engine sampled a token the
    # trainer finds unlikely, which P_policy would rarely produce
    assert 0 < m["policy_kl_error_is"].item() < 1 and 0 < m["js_divergence_error_is"].item() < 1


def test_a_float32_logprob_gap_beyond_88_stays_finite():
    m = mismatch_metrics(torch.tensor([-100.0]), torch.tensor([-1.0]), torch.ones(1))  # 1/r = e^99 > float32 max
    assert all(torch.isfinite(v) for v in m.values())
