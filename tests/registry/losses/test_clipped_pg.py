"""ClippedPG against float64 hand computations, and the identities it shares with AIPO, GSPO and CISPO."""

import math

import pytest
import torch

from grpokit.registry.losses.aipo import AIPO
from grpokit.registry.losses.cispo import CISPO
from grpokit.registry.losses.clipped_pg import ClippedPG
from grpokit.registry.losses.gspo import GSPO
from grpokit.testing import loss_and_grad, make_loss_inputs


def make_inputs(trainer, infer, adv, seq_ids, mask=None, **kw):
    return make_loss_inputs(trainer, infer, adv, seq_ids=seq_ids, mask=mask, **kw)


grad_of = loss_and_grad


# seq 0 (A = 1): ratios 1 and 1.5 (> 1 + 0.2: clipped); seq 1 (A = -1): ratios 0.5 (< 1 - 0.2: clipped) and 1.1.
TRAINER = [-1.0, -1.0, -2.0, -0.5]
INFER = [-1.0, -1.0 - math.log(1.5), -2.0 - math.log(0.5), -0.5 - math.log(1.1)]
ADV, SEQ_IDS = [1.0, 1.0, -1.0, -1.0], [0, 0, 1, 1]


def test_hand_computed_loss_gradient_and_clip_metrics():
    loss, metrics, grad = grad_of(ClippedPG(), make_inputs(TRAINER, INFER, ADV, SEQ_IDS))
    # obj = min(r A, clip(r) A): 1, min(1.5, 1.2) = 1.2, min(-0.5, -0.8) = -0.8, -1.1; loss = -(sum) / 4
    assert loss.item() == pytest.approx(-(1 + 1.2 - 0.8 - 1.1) / 4, abs=1e-12)
    # d loss / d logp = -A r / 4 where unclipped, 0 where the clip binds.
    assert grad == pytest.approx([-1 / 4, 0.0, 0.0, 1.1 / 4], abs=1e-12)
    assert metrics["clipped_frac"].item() == pytest.approx(0.5)
    assert metrics["clip_high_frac"].item() == pytest.approx(0.25) and metrics["clip_low_frac"].item() == pytest.approx(
        0.25
    )


def test_clip_higher_lets_the_positive_token_through():
    _, _, grad = grad_of(ClippedPG(eps_high=0.6), make_inputs(TRAINER, INFER, ADV, SEQ_IDS))
    assert grad == pytest.approx([-1 / 4, -1.5 / 4, 0.0, 1.1 / 4], abs=1e-12)


def test_dual_clip_bounds_negative_advantage_tokens():
    # A = -1 everywhere; ratios 5 (obj min(-5, -1.2) = -5 < -3: dual-clipped to -3, no gradient)
    # and 2 (obj -2 >= -3: kept).
    x = make_inputs([-1.0, -1.0], [-1.0 - math.log(5), -1.0 - math.log(2)], [-1.0, -1.0], [0, 1])
    loss, metrics, grad = grad_of(ClippedPG(ratio_clip_c=3.0), x)
    assert loss.item() == pytest.approx(-(-3 - 2) / 2, abs=1e-12)
    assert grad == pytest.approx([0.0, 2 / 2], abs=1e-12)
    assert metrics["dual_clipped_frac"].item() == pytest.approx(0.5)
    _, _, grad_plain = grad_of(
        ClippedPG(), make_inputs([-1.0, -1.0], x.inference_logprobs_T.tolist(), [-1.0, -1.0], [0, 1])
    )
    assert grad_plain == pytest.approx([5 / 2, 2 / 2], abs=1e-12)


def test_dual_clip_leaves_positive_advantages_alone():
    x = make_inputs([-1.0], [-1.0 - math.log(5)], [1.0], [0])
    loss, metrics, _ = grad_of(ClippedPG(ratio_clip_c=3.0), x)
    assert loss.item() == pytest.approx(-1.2, abs=1e-12) and metrics["dual_clipped_frac"].item() == 0.0


def test_kl_penalty_k3_and_its_gradient():
    # On-policy (ratio 1); reference logprobs differ. l = -A + beta k3; d k3 / d logp = 1 - exp(logq - logp).
    logq = [-1.5, -0.5]
    x = make_inputs(
        [-1.0, -1.0], [-1.0, -1.0], [1.0, -0.5], [0, 1], ref_logprobs_T=torch.tensor(logq, dtype=torch.float64)
    )
    loss, metrics, grad = grad_of(ClippedPG(beta=0.1), x)
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(0.5) - 0.5 - 1]
    assert loss.item() == pytest.approx((-(1.0 - 0.5) + 0.1 * sum(k3)) / 2, abs=1e-12)
    assert grad == pytest.approx(
        [(-1.0 + 0.1 * (1 - math.exp(-0.5))) / 2, (0.5 + 0.1 * (1 - math.exp(0.5))) / 2], abs=1e-12
    )
    assert metrics["ref_kl"].item() == pytest.approx(sum(k3) / 2)


def test_kl_estimator_choice_and_on_policy_weight():
    # k2's gradient is (logp - logq); the on-policy weight multiplies it by sg[exp(logp - logp_infer)] = 2.
    x = make_inputs([-1.0], [-1.0 - math.log(2)], [0.0], [0], ref_logprobs_T=torch.tensor([-1.5], dtype=torch.float64))
    _, _, grad = grad_of(ClippedPG(beta=0.1, kl_estimator="k2"), x)
    assert grad == pytest.approx([0.1 * 0.5], abs=1e-12)
    x = make_inputs([-1.0], [-1.0 - math.log(2)], [0.0], [0], ref_logprobs_T=torch.tensor([-1.5], dtype=torch.float64))
    loss, _, grad = grad_of(ClippedPG(beta=0.1, use_on_policy_kl_approximation=True), x)
    assert loss.item() == pytest.approx(0.1 * 2 * (math.exp(-0.5) + 0.5 - 1), abs=1e-12)
    assert grad == pytest.approx([0.1 * 2 * (1 - math.exp(-0.5))], abs=1e-12)


def test_reference_is_requested_only_with_beta_and_missing_one_is_a_clear_error():
    assert ClippedPG(beta=0.1).needs_reference and not ClippedPG().needs_reference
    with pytest.raises(ValueError, match="needs inputs.ref_logprobs_T"):
        ClippedPG(beta=0.1)(make_inputs([-1.0], [-1.0], [1.0], [0]))


def test_truncated_importance_sampling_correction():
    # Weights exp(logp - logp_infer) = 1.5 and 4 -> capped at 2; ratio against sg[logp] is 1, so no clip binds.
    x = make_inputs([-1.0, -2.0], [-1.0 - math.log(1.5), -2.0 - math.log(4)], [1.0, -1.0], [0, 1])
    loss, metrics, grad = grad_of(ClippedPG(use_importance_sampling_correction=True), x)
    assert loss.item() == pytest.approx(-(1.5 * 1 + 2 * -1) / 2, abs=1e-12)
    assert grad == pytest.approx([-1.5 / 2, 2 / 2], abs=1e-12)  # -w A / N
    assert metrics["is_capped_frac"].item() == pytest.approx(0.5) and metrics["clipped_frac"].item() == 0.0
    # Without it the ratio is against the engine: 1.5 is clipped (A > 0), 4 is not (A < 0: only the low side clips).
    _, _, grad = grad_of(ClippedPG(), make_inputs([-1.0, -2.0], x.inference_logprobs_T.tolist(), [1.0, -1.0], [0, 1]))
    assert grad == pytest.approx([0.0, 4 / 2], abs=1e-12)


def test_overlong_filtering_zeroes_truncated_sequences_but_keeps_the_normaliser():
    x = make_inputs(
        [-1.0, -1.0, -1.0], [-1.0] * 3, [1.0, 1.0, 2.0], [0, 0, 1], is_truncated_N=torch.tensor([False, True])
    )
    loss, metrics, grad = grad_of(ClippedPG(overlong_filtering=True), x)
    assert loss.item() == pytest.approx(-2 / 3, abs=1e-12)
    assert grad == pytest.approx([-1 / 3, -1 / 3, 0.0], abs=1e-12)
    assert metrics["masked_frac"].item() == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="overlong_filtering needs inputs.is_truncated_N"):
        ClippedPG(overlong_filtering=True)(make_inputs([-1.0], [-1.0], [1.0], [0]))


@pytest.mark.parametrize(
    "kw, expected",
    [
        # seq 0 has 1 loss token, seq 1 has 3; A = 1 and -1; 2 step sequences.
        ({"normalization": "sequence"}, [-1 / (1 * 2), 1 / (3 * 2), 1 / (3 * 2), 1 / (3 * 2)]),
        ({"normalization": "constant", "max_tokens_normalizer": 8}, [-1 / 16, 1 / 16, 1 / 16, 1 / 16]),
        ({"normalization": "bnpo"}, [-1 / 4, 1 / 4, 1 / 4, 1 / 4]),
    ],
)
def test_normalization_modes_set_the_gradient_scale(kw, expected):
    x = make_inputs([-1.0] * 4, [-1.0] * 4, [1.0, -1.0, -1.0, -1.0], [0, 1, 1, 1], loss_normalizer=100.0)
    _, _, grad = grad_of(ClippedPG(**kw), x)
    assert grad == pytest.approx(expected, abs=1e-12)


def test_all_tokens_masked_gives_finite_zero_loss():
    # Masked positions hold garbage, as prompt tokens may.
    x = make_inputs(
        [-1.0, -1000.0],
        [0.0, 0.0],
        [1.0, 1.0],
        [0, 0],
        mask=[0, 0],
        ref_logprobs_T=torch.tensor([0.0, 0.0], dtype=torch.float64),
    )
    loss, metrics, grad = grad_of(ClippedPG(beta=0.1, ratio_clip_c=3.0, use_on_policy_kl_approximation=True), x)
    assert loss.item() == 0.0 and grad == [0.0, 0.0]
    assert all(torch.isfinite(v) for v in metrics.values())


def test_single_token_and_equal_zero_advantages():
    _, _, grad = grad_of(ClippedPG(), make_inputs([-0.3], [-0.3], [2.0], [0], loss_normalizer=4.0))
    assert grad == pytest.approx([-2 / 4], abs=1e-12)
    # A group whose rewards were all equal has A = 0: no loss, no gradient.
    loss, _, grad = grad_of(ClippedPG(), make_inputs([-1.0, -2.0], [-1.5, -1.0], [0.0, 0.0], [0, 1]))
    assert loss.item() == 0.0 and grad == [0.0, 0.0]


def test_huge_eps_is_the_unclipped_surrogate():
    torch.manual_seed(0)
    trainer, infer = (
        (-torch.rand(12, dtype=torch.float64) * 3).tolist(),
        (-torch.rand(12, dtype=torch.float64) * 3).tolist(),
    )
    adv, seq_ids = torch.randn(12, dtype=torch.float64).tolist(), [0] * 5 + [1] * 7
    x = make_inputs(trainer, infer, adv, seq_ids, loss_normalizer=20.0)
    loss, _, grad = grad_of(ClippedPG(eps_low=1e9, eps_high=1e9), x)
    y = make_inputs(trainer, infer, adv, seq_ids, loss_normalizer=20.0)
    plain = -(torch.exp(y.trainer_logprobs_T - y.inference_logprobs_T) * y.advantages_T).sum() / 20.0
    plain.backward()
    assert loss.item() == pytest.approx(plain.item(), abs=1e-12)
    assert grad == pytest.approx(y.trainer_logprobs_T.grad.tolist(), abs=1e-12)


def test_on_policy_equal_lengths_aipo_clipped_pg_gspo_cispo_share_the_gradient():
    # ratio 1, 3 sequences of 4 tokens, token normalisation: every loss gives d/d logp_t = -A_t / 12.
    torch.manual_seed(1)
    trainer = (-torch.rand(12, dtype=torch.float64) * 3).tolist()
    adv = [a for a in torch.randn(3, dtype=torch.float64).tolist() for _ in range(4)]
    seq_ids = [i for i in range(3) for _ in range(4)]
    expected = [-a / 12 for a in adv]
    for loss_fn in [AIPO(), ClippedPG(), GSPO(), CISPO()]:
        _, _, grad = grad_of(loss_fn, make_inputs(trainer, trainer, adv, seq_ids))
        assert grad == pytest.approx(expected, abs=1e-12), type(loss_fn).__name__


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"eps_low": -0.1}, "eps_low >= 0 and eps_high >= 0"),
        ({"ratio_clip_c": 1.0}, "ratio_clip_c must be > 1"),
        ({"beta": -1.0}, "beta must be >= 0"),
        ({"beta": 0.1, "kl_estimator": "k4"}, "kl_estimator must be one of k1, k2, k3"),
        ({"use_on_policy_kl_approximation": True}, "set beta > 0"),
        ({"is_cap": 0.5}, "is_cap must be >= 1"),
        ({"normalization": "constant"}, "needs max_tokens_normalizer"),
        ({"max_tokens_normalizer": 512}, "only with normalization='constant'"),
    ],
)
def test_bad_arguments_are_rejected_with_their_names(kw, message):
    with pytest.raises(ValueError, match=message):
        ClippedPG(**kw)


def test_entropy_bonus_hand_case_and_gradient():
    # on-policy, A = 0: the only term is -c * H_t, token-normalised over 2 tokens
    x = make_inputs([-1.0, -2.0], [-1.0, -2.0], [0.0, 0.0], [0, 0])
    entropy = torch.tensor([0.5, 1.5], dtype=torch.float64, requires_grad=True)
    x.entropy_T = entropy
    loss, metrics = ClippedPG(entropy_coeff=0.1)(x)
    assert loss.item() == pytest.approx(-0.1 * (0.5 + 1.5) / 2, abs=1e-12)
    assert metrics["entropy"].item() == pytest.approx(1.0)
    loss.backward()
    assert entropy.grad.tolist() == pytest.approx([-0.05, -0.05], abs=1e-12)
    assert ClippedPG(entropy_coeff=0.1).needs_entropy and not ClippedPG().needs_entropy
    with pytest.raises(ValueError, match="entropy_coeff must be >= 0"):
        ClippedPG(entropy_coeff=-1.0)
