"""ClippedPG and GSPO with float32 log-ratios past exp()'s overflow (~88.7): the gradient stays finite, a
clipped token gets exactly 0, and an unclipped one is weighted as if its ratio were e^U (the losses' cap)."""

import math

import pytest
import torch

from grpokit.registry.losses.clipped_pg import ClippedPG
from grpokit.registry.losses.gspo import GSPO
from grpokit.testing import loss_and_grad, make_loss_inputs


def float32_inputs(trainer, infer, adv, seq_ids, **kw):
    """make_loss_inputs in float32, the trainer's logprob dtype, where exp(89) is inf."""
    x = make_loss_inputs(trainer, infer, adv, seq_ids=seq_ids, **kw)
    for name in ("inference_logprobs_T", "advantages_T", "loss_mask_T"):
        setattr(x, name, getattr(x, name).float())
    if x.ref_logprobs_T is not None:
        x.ref_logprobs_T = x.ref_logprobs_T.float()
    x.trainer_logprobs_T = x.trainer_logprobs_T.detach().float().requires_grad_()
    return x


# One token per sequence, token normalisation over 5 tokens. Log-ratios logp - logq:
#   0: +100, A = 1   clipped high             1: -100, A = -1  clipped low
#   2: +100, A = 0   no objective             3: +100, A = -1  unclipped without dual-clip
#   4: +0.1, A = 1   in range
TRAINER = [-1.0] * 5
INFER = [-101.0, 99.0, -101.0, -101.0, -1.1]
ADV, SEQ_IDS = [1.0, -1.0, 0.0, -1.0, 1.0], [0, 1, 2, 3, 4]


def test_clipped_pg_overflowing_ratio_gives_finite_gradient_and_zero_for_clipped_tokens():
    loss_fn = ClippedPG()
    cap = math.exp(20 + math.log(2.0))  # U = 20 + the largest bound, here log(is_cap = 2)
    assert loss_fn.max_log_ratio == pytest.approx(20 + math.log(2.0), abs=1e-12)
    loss, metrics, grad = loss_and_grad(loss_fn, float32_inputs(TRAINER, INFER, ADV, SEQ_IDS))
    # obj: 1.2, -0.8, 0, -e^U, e^0.1; d loss / d logp = -A r / 5 where unclipped
    r4 = math.exp(0.1)
    assert loss.item() == pytest.approx(-(1.2 - 0.8 + 0 - cap + r4) / 5, rel=1e-6)
    assert grad[:3] == [0.0, 0.0, 0.0]
    assert grad[3] == pytest.approx(cap / 5, rel=1e-6) and math.isfinite(grad[3])
    assert grad[4] == pytest.approx(-r4 / 5, rel=1e-6)
    assert metrics["clip_high_frac"].item() == pytest.approx(1 / 5)
    assert metrics["clip_low_frac"].item() == pytest.approx(1 / 5)


def test_clipped_pg_dual_clip_zeroes_the_overflowing_negative_token():
    loss, metrics, grad = loss_and_grad(ClippedPG(ratio_clip_c=3.0), float32_inputs(TRAINER, INFER, ADV, SEQ_IDS))
    r4 = math.exp(0.1)
    assert loss.item() == pytest.approx(-(1.2 - 0.8 + 0 - 3.0 + r4) / 5, rel=1e-6)
    assert grad[:4] == [0.0, 0.0, 0.0, 0.0]
    assert grad[4] == pytest.approx(-r4 / 5, rel=1e-6)
    assert metrics["dual_clipped_frac"].item() == pytest.approx(1 / 5)


def test_clipped_pg_importance_weights_and_on_policy_kl_stay_finite():
    # Truncated IS: the ratio is against sg[logp] (1), the weight exp(logp - logq) overflows and is capped at 2.
    loss, metrics, grad = loss_and_grad(
        ClippedPG(use_importance_sampling_correction=True), float32_inputs(TRAINER, INFER, ADV, SEQ_IDS)
    )
    w = [2.0, math.exp(-100), 2.0, 2.0, math.exp(0.1)]
    assert loss.item() == pytest.approx(-sum(wi * a for wi, a in zip(w, ADV)) / 5, rel=1e-6)
    assert grad == pytest.approx([-wi * a / 5 for wi, a in zip(w, ADV)], rel=1e-6, abs=1e-30)
    assert metrics["is_capped_frac"].item() == pytest.approx(3 / 5)
    # The detached on-policy KL weight exp(logp - logq) is capped at e^U: k3 = 0 here (ref = policy) and stays 0.
    ref = torch.tensor(TRAINER, dtype=torch.float64)
    x = float32_inputs(TRAINER, INFER, ADV, SEQ_IDS, ref_logprobs_T=ref)
    loss, metrics, grad = loss_and_grad(ClippedPG(beta=0.1, use_on_policy_kl_approximation=True, ratio_clip_c=3.0), x)
    assert math.isfinite(loss.item()) and all(math.isfinite(g) for g in grad)
    assert metrics["ref_kl"].item() == 0.0 and grad[:4] == [0.0, 0.0, 0.0, 0.0]


def test_gspo_overflowing_sequence_ratio_gives_finite_gradient_and_zero_for_clipped_sequences():
    # seq 0 (A = 1): mean log-ratio 100, clipped high; seq 1 (A = -1): 100, unclipped (only the low side
    # clips for A < 0); seq 2 (A = 1): mean log-ratio 0, in range. Sequence normalisation over 3 sequences.
    loss_fn = GSPO()
    u = 20 + math.log1p(4e-4)
    assert loss_fn.max_log_ratio == pytest.approx(u, abs=1e-12)
    x = float32_inputs(
        [-1.0, -1.0, -1.0, -1.0, -2.0],
        [-101.0, -101.0, -101.0, -1.0, -2.0],
        [1.0, 1.0, -1.0, 1.0, 1.0],
        [0, 0, 1, 2, 2],
    )
    loss, _, grad = loss_and_grad(loss_fn, x)
    cap = math.exp(u)
    assert loss.item() == pytest.approx(-(1.0004 - cap + 1.0) / 3, rel=1e-6)
    assert grad[:2] == [0.0, 0.0]
    assert grad[2] == pytest.approx(cap / 3, rel=1e-6) and math.isfinite(grad[2])
    assert grad[3:] == pytest.approx([-1 / 6, -1 / 6], rel=1e-6)
