"""GSPO against float64 hand computations and the sequence form's gradient."""

import math

import pytest
import torch

from grpokit.registry.losses.gspo import GSPO
from grpokit.testing import loss_and_grad, make_loss_inputs


def make_inputs(trainer, infer, adv, seq_ids, mask=None, **kw):
    return make_loss_inputs(trainer, infer, adv, seq_ids=seq_ids, mask=mask, **kw)


grad_of = loss_and_grad


def test_hand_computed_sequence_ratio_clip_and_gradient():
    # seq 0 (A = 1): log ratios 0.1, 0.3 -> s = e^0.2 = 1.2214 > 1.2: clipped, no gradient.
    # seq 1 (A = -1): log ratios 0.2, -0.05, 0 -> s = e^0.05 = 1.0513 (only the low side clips for A < 0).
    trainer = [-1.0, -2.0, -0.5, -1.5, -3.0]
    infer = [-1.1, -2.3, -0.7, -1.45, -3.0]
    x = make_inputs(trainer, infer, [1.0, 1.0, -1.0, -1.0, -1.0], [0, 0, 1, 1, 1])
    loss, metrics, grad = grad_of(GSPO(eps_low=0.2, eps_high=0.2), x)
    s1 = math.exp(0.05)
    # per-sequence token means: -1.2 and +s1; summed over the 2 step sequences / 2
    assert loss.item() == pytest.approx((-1.2 + s1) / 2, abs=1e-12)
    # d loss / d logp_t = -A s_i / (|y_i| * step_num_seqs)
    assert grad == pytest.approx([0.0, 0.0, s1 / 6, s1 / 6, s1 / 6], abs=1e-12)
    assert metrics["clipped_frac"].item() == pytest.approx(2 / 5) and metrics["clip_high_frac"].item() == pytest.approx(
        2 / 5
    )
    assert metrics["seq_ratio"].item() == pytest.approx((2 * math.exp(0.2) + 3 * s1) / 5)


def test_paper_defaults_clip_tiny_sequence_drift():
    # mean log ratio 1e-3 -> s = 1.0010005 > 1 + 4e-4 for A > 0: clipped; on-policy seq 1 is not.
    x = make_inputs([-1.0, -1.0, -2.0], [-1.0015, -1.0005, -2.0], [1.0, 1.0, 1.0], [0, 0, 1])
    _, metrics, grad = grad_of(GSPO(), x)
    assert grad == pytest.approx([0.0, 0.0, -1 / 2], abs=1e-12)
    assert metrics["clipped_frac"].item() == pytest.approx(2 / 3)


def test_token_form_gradient_equals_the_sequence_form():
    # Unclipped, GSPO-token's gradient is GSPO's: d/d logp_t of -s_i A_i / N with s_i = exp(mean_t log ratio).
    torch.manual_seed(0)
    trainer = (-torch.rand(9, dtype=torch.float64) * 2).tolist()
    infer = [t + 0.1 * d for t, d in zip(trainer, torch.randn(9, dtype=torch.float64).tolist())]
    adv, seq_ids = [0.7] * 4 + [-1.3] * 5, [0] * 4 + [1] * 5
    _, _, grad = grad_of(GSPO(eps_low=1e9, eps_high=1e9), make_inputs(trainer, infer, adv, seq_ids))
    y = make_inputs(trainer, infer, adv, seq_ids)
    log_ratio = y.trainer_logprobs_T - y.inference_logprobs_T
    s0, s1 = log_ratio[:4].mean().exp(), log_ratio[4:].mean().exp()
    (-(s0 * 0.7 + s1 * -1.3) / 2).backward()
    assert grad == pytest.approx(y.trainer_logprobs_T.grad.tolist(), abs=1e-12)


def test_masked_tokens_stay_out_of_the_sequence_ratio():
    # token 0 is a prompt token with a huge log ratio; the sequence ratio is over token 1 alone (ratio 1).
    x = make_inputs([-1.0, -2.0], [-40.0, -2.0], [1.0, 1.0], [0, 0], mask=[0, 1])
    loss, metrics, grad = grad_of(GSPO(), x)
    assert loss.item() == pytest.approx(-1.0, abs=1e-12) and grad == pytest.approx([0.0, -1.0], abs=1e-12)
    assert metrics["clipped_frac"].item() == 0.0


def test_all_tokens_masked_and_single_token():
    loss, metrics, grad = grad_of(GSPO(), make_inputs([-1.0, -2.0], [0.0, 0.0], [1.0, 1.0], [0, 1], mask=[0, 0]))
    assert loss.item() == 0.0 and grad == [0.0, 0.0] and all(torch.isfinite(v) for v in metrics.values())
    _, _, grad = grad_of(GSPO(), make_inputs([-0.5], [-0.5], [3.0], [0], step_num_seqs=4))
    assert grad == pytest.approx([-3 / 4], abs=1e-12)


def test_equal_advantages_of_zero_give_no_gradient():
    loss, _, grad = grad_of(GSPO(), make_inputs([-1.0, -2.0], [-1.2, -1.9], [0.0, 0.0], [0, 0]))
    assert loss.item() == 0.0 and grad == [0.0, 0.0]


def test_negative_eps_is_rejected():
    with pytest.raises(ValueError, match="eps_low >= 0 and eps_high >= 0"):
        GSPO(eps_high=-1e-4)
