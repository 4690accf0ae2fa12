"""AIPO against float64 hand computations."""

import math

import pytest
import torch

from grpokit.loss import LossInputs
from grpokit.registry.losses.aipo import AIPO
from grpokit.testing import check_component, check_loss, loss_and_grad, make_loss_inputs


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
        adv=[0.5, 0.5, -1.0],
        mask=[1, 1, 1],
        seq_ids=[0, 0, 1],
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
        trainer=[-1.0, -1.0, -2.0],
        infer=[-1.0 - math.log(4), -1.0 - math.log(4), -2.0],
        adv=[1.0, 1.0, 2.0],
        mask=[1, 1, 1],
        seq_ids=[0, 0, 1],
    )
    loss, metrics = AIPO(geo_mask_high=3.0)(x)
    assert loss.item() == pytest.approx(-(2.0 * -2.0) / 3, abs=1e-12)
    assert metrics["seq_masked_frac"].item() == pytest.approx(2 / 3)


def test_low_token_mask_and_loss_mask():
    # token 0 is a prompt token (mask 0); token 1 has ratio 1/16 < 0.125 -> masked; token 2 kept.
    x = inputs(
        trainer=[-3.0, -1.0, -1.5],
        infer=[-0.1, -1.0 + math.log(16), -1.5],
        adv=[9.0, 1.0, 1.0],
        mask=[0, 1, 1],
        seq_ids=[0, 0, 0],
    )
    loss, metrics = AIPO()(x)
    assert loss.item() == pytest.approx(-(1.0 * -1.5) / 2, abs=1e-12)
    assert metrics["masked_frac"].item() == pytest.approx(0.5)


def test_on_policy_gradient_is_advantage_over_normalizer():
    x = inputs(
        trainer=[-0.7, -1.2, -0.3, -2.0],
        infer=[-0.7, -1.2, -0.3, -2.0],
        adv=[2.0, 2.0, -1.0, -1.0],
        mask=[1, 1, 1, 1],
        seq_ids=[0, 0, 1, 1],
        normalizer=8,
    )
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


# ratio_type "sequence", min/max sequence masking and sequence_clip_high.

LN2 = math.log(2)


def test_defaults_give_the_same_numbers_as_before_the_sequence_options():
    # The first case above; the literals are what AIPO(kl_tau=0.1) returned before ratio_type and the
    # sequence_* options existed. sequence_clip_high is unused with ratio_type "token".
    for loss_fn in [
        AIPO(kl_tau=0.1),
        AIPO(kl_tau=0.1, ratio_type="token", sequence_mask_low=0.0, sequence_mask_high=100.0, sequence_clip_high=10.0),
        AIPO(kl_tau=0.1, sequence_clip_high=1.0),
    ]:
        x = make_loss_inputs(
            [-1.0, -2.0, -0.5], [-1.0, -2.0 - LN2, -0.5 - math.log(9)], [0.5, 0.5, -1.0], seq_ids=[0, 0, 1]
        )
        loss, metrics, grad = loss_and_grad(loss_fn, x)
        assert loss.item() == 0.740913709258674
        assert grad == [-0.16666666666666666, -0.2871235212960036, 0.0]
        assert metrics["masked_frac"].item() == metrics["token_masked_frac"].item() == pytest.approx(1 / 3)
        assert metrics["seq_masked_frac"].item() == metrics["sequence_masked_frac"].item() == 0.0


def test_sequence_ratio_hand_computed_loss_and_gradient():
    # seq 0: a prompt token (off-policy, but outside the loss) and loss tokens of ratio 2, 4, 9 (9 > 8 is
    # token-masked but still counts in s_0 = (2 * 4 * 9)^(1/3) = 72^(1/3)), A = 0.5.
    # seq 1: one token of ratio 1/2, A = -1. 4 loss tokens.
    x = make_loss_inputs(
        trainer=[-3.0, -1.0, -2.0, -0.5, -0.7],
        infer=[-0.1, -1.0 - LN2, -2.0 - math.log(4), -0.5 - math.log(9), -0.7 + LN2],
        adv=[0.5, 0.5, 0.5, 0.5, -1.0],
        seq_ids=[0, 0, 0, 0, 1],
        mask=[0, 1, 1, 1, 1],
    )
    loss, metrics, grad = loss_and_grad(AIPO(kl_tau=0.1, ratio_type="sequence"), x)
    c0 = 72 ** (1 / 3) * (0.5 - 0.1 * math.log(72) / 3)  # s_0 * (adv_tau A - kl_tau log s_0)
    c1 = 0.5 * (-1.0 - 0.1 * -LN2)
    assert loss.item() == pytest.approx(-(c0 * -1.0 + c0 * -2.0 + c1 * -0.7) / 4, abs=1e-12)
    assert grad == pytest.approx([0.0, -c0 / 4, -c0 / 4, 0.0, -c1 / 4], abs=1e-12)
    assert metrics["token_masked_frac"].item() == metrics["masked_frac"].item() == pytest.approx(1 / 4)
    assert metrics["sequence_masked_frac"].item() == 0.0


def test_sequence_ratio_equals_token_ratio_for_one_token_sequences():
    trainer, infer = [-1.0, -0.4, -2.5], [-1.3, -0.1, -2.0]
    out = []
    for ratio_type in ["token", "sequence"]:
        x = make_loss_inputs(trainer, infer, [1.0, -0.5, 2.0], seq_ids=[0, 1, 2])
        loss, _, grad = loss_and_grad(AIPO(kl_tau=0.2, ratio_type=ratio_type), x)
        out.append([loss.item(), *grad])
    assert out[0] == pytest.approx(out[1], abs=1e-12)


@pytest.mark.parametrize("clip, weight_0", [(3.0, 3.0), (100.0, 4.0)])
def test_sequence_clip_high_caps_the_weight_but_not_the_kl_log_ratio(clip, weight_0):
    # seq 0: two tokens of ratio 4 -> s_0 = 4 (kept: geo_mask_high 100); seq 1: two of ratio 2 -> s_1 = 2 < 3.
    x = make_loss_inputs(
        trainer=[-1.0, -2.0, -0.5, -1.5],
        infer=[-1.0 - math.log(4), -2.0 - math.log(4), -0.5 - LN2, -1.5 - LN2],
        adv=[1.0, 1.0, -1.0, -1.0],
        seq_ids=[0, 0, 1, 1],
    )
    loss, _, grad = loss_and_grad(
        AIPO(kl_tau=0.1, ratio_type="sequence", geo_mask_high=100.0, sequence_clip_high=clip), x
    )
    c0 = weight_0 * (1.0 - 0.1 * math.log(4))
    c1 = 2.0 * (-1.0 - 0.1 * LN2)
    assert loss.item() == pytest.approx(-(c0 * -3.0 + c1 * -2.0) / 4, abs=1e-12)
    assert grad == pytest.approx([-c0 / 4, -c0 / 4, -c1 / 4, -c1 / 4], abs=1e-12)


def test_min_max_sequence_mask_at_and_around_its_thresholds():
    # With sequence_mask_low 0.5 and sequence_mask_high 2 (exp(-+ln 2) is exactly 0.5 and 2 in float64):
    # seq 0: prompt token (its ratio e^-10 must not count), ratios 1 and exactly 0.5 -> kept;
    # seq 1: ratios 1 and just under 0.5 -> masked; seq 2: exactly 2 -> kept; seq 3: just over 2 -> masked.
    x = make_loss_inputs(
        trainer=[-2.0, -1.0, 0.0, -1.0, 0.0, 0.0, 0.0],
        infer=[8.0, -1.0, LN2, -1.0, LN2 + 1e-6, -LN2, -LN2 - 1e-6],
        adv=[1.0] * 7,
        seq_ids=[0, 0, 0, 1, 1, 2, 3],
        mask=[0, 1, 1, 1, 1, 1, 1],
    )
    loss, metrics, grad = loss_and_grad(AIPO(sequence_mask_low=0.5, sequence_mask_high=2.0), x)
    assert loss.item() == pytest.approx(-(1.0 * -1.0) / 6, abs=1e-12)
    assert grad == pytest.approx([0.0, -1 / 6, -0.5 / 6, 0.0, 0.0, -2 / 6, 0.0], abs=1e-12)
    assert metrics["sequence_masked_frac"].item() == metrics["masked_frac"].item() == pytest.approx(3 / 6)
    assert metrics["token_masked_frac"].item() == metrics["seq_masked_frac"].item() == 0.0


@pytest.mark.parametrize("sequence_mask_high, kept", [(100.0, False), (math.inf, True)])
def test_default_sequence_mask_high_drops_a_sequence_with_a_token_ratio_over_100(sequence_mask_high, kept):
    # Ratios 1, 200, 1/20: the last two are token-masked and s = 10^(1/3) passes the geometric mask, so
    # before sequence_mask_high the ratio-1 token was kept; the default 100 now drops the whole sequence.
    x = make_loss_inputs([-1.0, -2.0, -3.0], [-1.0, -2.0 - math.log(200), -3.0 + math.log(20)], [1.0] * 3)
    loss, metrics, grad = loss_and_grad(AIPO(sequence_mask_high=sequence_mask_high), x)
    assert grad == pytest.approx([-1 / 3 if kept else 0.0, 0.0, 0.0], abs=1e-12)
    assert metrics["sequence_masked_frac"].item() == (0.0 if kept else 1.0)


def test_contracts_hold_in_both_ratio_types():
    check_component(AIPO)
    check_loss(AIPO(ratio_type="sequence", kl_tau=0.1))
    check_loss(AIPO(ratio_type="sequence", sequence_mask_low=0.9, sequence_mask_high=1.1, sequence_clip_high=1.0))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"ratio_type": "seq"}, "ratio_type"),
        ({"sequence_mask_low": 1.5}, "sequence_mask_low"),
        ({"sequence_mask_low": -0.1}, "sequence_mask_low"),
        ({"sequence_mask_high": 0.5}, "sequence_mask_high"),
        ({"sequence_clip_high": 0.5}, "sequence_clip_high"),
    ],
)
def test_bad_sequence_options_are_rejected_with_their_names(kwargs, name):
    with pytest.raises(ValueError, match=name):
        AIPO(**kwargs)


# teacher_tau: on-policy distillation toward a frozen teacher's logprobs.


def test_teacher_term_hand_computed_loss_gradient_and_metric():
    # seq 0: ratios 1 and 2, A = 1; seq 1: ratio 1, A = -1. teacher_tau 0.5, so A'_t = A_t + 0.5 (q_t - p_t):
    # token 0: 1 + 0.5 * 0.5 = 1.25; token 1: 1 + 0.5 * -0.5 = 0.75 (times ratio 2: 1.5); token 2: -1 - 0.15.
    x = make_loss_inputs(
        trainer=[-1.0, -2.0, -0.5],
        infer=[-1.0, -2.0 - LN2, -0.5],
        adv=[1.0, 1.0, -1.0],
        seq_ids=[0, 0, 1],
        teacher_logprobs_T=torch.tensor([-0.5, -2.5, -0.8], dtype=torch.float64),
    )
    loss, metrics, grad = loss_and_grad(AIPO(teacher_tau=0.5), x)
    assert loss.item() == pytest.approx(-(1.25 * -1.0 + 1.5 * -2.0 + -1.15 * -0.5) / 3, abs=1e-12)
    assert grad == pytest.approx([-1.25 / 3, -1.5 / 3, 1.15 / 3], abs=1e-12)
    assert metrics["teacher_kl"].item() == pytest.approx((-0.5 + 0.5 + 0.3) / 3, abs=1e-12)  # mean(p - q)


def test_teacher_term_follows_the_masks_and_ignores_off_mask_teacher_values():
    # token 0 is a prompt token with a non-finite teacher logprob; token 2 has ratio 9 > token_mask_high.
    x = make_loss_inputs(
        trainer=[-3.0, -1.0, -0.5],
        infer=[-3.0, -1.0, -0.5 - math.log(9)],
        adv=[0.0, 0.0, 0.0],
        mask=[0, 1, 1],
        teacher_logprobs_T=torch.tensor([-math.inf, -0.6, -0.1], dtype=torch.float64),
    )
    loss, metrics, grad = loss_and_grad(AIPO(teacher_tau=2.0), x)
    assert grad == pytest.approx([0.0, -2.0 * 0.4 / 2, 0.0], abs=1e-12)
    assert torch.isfinite(loss) and metrics["teacher_kl"].item() == pytest.approx((-0.4 - 0.4) / 2, abs=1e-12)


def test_teacher_term_expected_gradient_is_the_reverse_kl_gradient():
    # One position, V = 3 tokens, sampled from the policy p (ratio 1, A = 0): sum_x p(x) d loss_x / d theta,
    # with loss_x the loss of token x, equals teacher_tau * grad KL(p || q) (the k1 reward's policy gradient).
    theta = torch.tensor([0.3, -0.2, 0.9], dtype=torch.float64, requires_grad=True)
    logq = torch.log_softmax(torch.tensor([1.0, 0.5, -1.0], dtype=torch.float64), -1)
    logp = torch.log_softmax(theta, -1)
    x = make_loss_inputs(
        logp.tolist(), logp.tolist(), [0.0] * 3, seq_ids=[0, 1, 2], loss_normalizer=1.0, teacher_logprobs_T=logq
    )
    _, _, grad_logp = loss_and_grad(AIPO(teacher_tau=0.7), x)  # d loss_x / d logp(x), token x alone
    expected = torch.autograd.grad(
        logp, theta, grad_outputs=logp.exp().detach() * torch.tensor(grad_logp, dtype=torch.float64), retain_graph=True
    )[0]
    kl = (logp.exp() * (logp - logq)).sum()
    (kl_grad,) = torch.autograd.grad(kl, theta)
    assert expected.tolist() == pytest.approx((0.7 * kl_grad).tolist(), abs=1e-12)


def test_teacher_tau_without_teacher_logprobs_names_the_recipe_key():
    x = make_loss_inputs([-1.0], [-1.0], [1.0])
    with pytest.raises(ValueError, match="model.teacher_model"):
        AIPO(teacher_tau=1.0)(x)
    with pytest.raises(ValueError, match="teacher_tau >= 0"):
        AIPO(teacher_tau=-1.0)


def test_teacher_equal_to_the_policy_changes_nothing_and_contracts_hold():
    trainer, infer, adv = [-1.0, -2.0, -0.5], [-1.1, -1.8, -0.5], [0.5, 0.5, -1.0]
    plain = loss_and_grad(AIPO(kl_tau=0.1), make_loss_inputs(trainer, infer, adv, seq_ids=[0, 0, 1]))
    x = make_loss_inputs(
        trainer, infer, adv, seq_ids=[0, 0, 1], teacher_logprobs_T=torch.tensor(trainer, dtype=torch.float64)
    )
    taught = loss_and_grad(AIPO(kl_tau=0.1, teacher_tau=3.0), x)
    assert taught[0].item() == plain[0].item() and taught[2] == plain[2]
    assert AIPO(teacher_tau=1.0).needs_teacher and not AIPO().needs_teacher
    check_loss(AIPO(teacher_tau=1.0))
    check_loss(AIPO(teacher_tau=1.0, ratio_type="sequence"))
