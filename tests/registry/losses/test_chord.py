"""Chord against float64 hand computations: the mixture, the SFT term (plain and phi), the mu schedule."""

import math

import pytest
import torch

from grpokit.registry.losses.aipo import AIPO
from grpokit.registry.losses.chord import Chord
from grpokit.registry.losses.clipped_pg import ClippedPG
from grpokit.testing import check_component, check_loss, loss_and_grad, make_loss_inputs


def mixed_inputs(**overrides):
    """seq 0: two sampled tokens on-policy with A = 1; seq 1: two expert tokens (outside the loss mask)."""
    fields = {
        "expert_mask_T": torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=torch.float64),
        "expert_normalizer": 2.0,
        **overrides,
    }
    return make_loss_inputs(
        [-1.0, -2.0, -0.5, -0.25],
        [-1.0, -2.0, 0.0, 0.0],
        [1.0, 1.0, 0.0, 0.0],
        seq_ids=[0, 0, 1, 1],
        mask=[1, 1, 0, 0],
        **fields,
    )


def test_hand_computed_mixture_of_rl_and_sft():
    # RL (AIPO, ratio 1): -(1 * -1 + 1 * -2) / 2 = 1.5, grad -1/2 per token; SFT: -(-0.5 - 0.25) / 2 = 0.375, grad -1/2.
    loss, metrics, grad = loss_and_grad(Chord(rl_loss=AIPO(), mu_peak=0.3, mu_valley=0.3), mixed_inputs())
    assert loss.item() == pytest.approx(0.7 * 1.5 + 0.3 * 0.375, abs=1e-12)
    assert grad == pytest.approx([-0.7 / 2, -0.7 / 2, -0.3 / 2, -0.3 / 2], abs=1e-12)
    assert metrics["mu"].item() == pytest.approx(0.3) and metrics["expert_nll"].item() == pytest.approx(
        0.375, abs=1e-12
    )
    assert "masked_frac" in metrics  # the RL loss's metrics pass through


def test_phi_weights_each_expert_token_by_p_times_one_minus_p():
    phi = [math.exp(lp) * (1 - math.exp(lp)) for lp in (-0.5, -0.25)]
    loss, _, grad = loss_and_grad(
        Chord(rl_loss=AIPO(), mu_peak=1.0, mu_valley=1.0, enable_phi_function=True), mixed_inputs()
    )
    assert loss.item() == pytest.approx(-(phi[0] * -0.5 + phi[1] * -0.25) / 2, abs=1e-12)
    assert grad == pytest.approx([0.0, 0.0, -phi[0] / 2, -phi[1] / 2], abs=1e-12)  # the weight is detached


def test_mu_zero_is_the_rl_loss_and_the_sft_term_is_normalised_over_the_step():
    rl = ClippedPG(eps_high=0.28)
    alone = loss_and_grad(rl, mixed_inputs())
    wrapped = loss_and_grad(Chord(rl_loss=rl, mu_peak=0.0, mu_valley=0.0), mixed_inputs())
    assert wrapped[0].item() == alone[0].item() and wrapped[2] == alone[2]
    # 8 expert tokens in the whole step, 2 of them here: this micro-batch's share is a quarter of its token mean
    _, _, grad = loss_and_grad(Chord(rl_loss=AIPO(), mu_peak=1.0, mu_valley=1.0), mixed_inputs(expert_normalizer=8.0))
    assert grad == pytest.approx([0.0, 0.0, -1 / 8, -1 / 8], abs=1e-12)


@pytest.mark.parametrize("step, mu", [(0, 0.0), (2, 0.25), (4, 0.5), (9, 0.1 + 0.4 * 0.5), (14, 0.1), (100, 0.1)])
def test_mu_warms_up_linearly_then_decays_by_a_cosine(step, mu):
    chord = Chord(mu_peak=0.5, mu_valley=0.1, mu_warmup_steps=4, mu_decay_steps=10)
    assert chord.mu(step) == pytest.approx(mu, abs=1e-12)
    _, metrics = chord(mixed_inputs(step=step))
    assert metrics["mu"].item() == pytest.approx(mu, abs=1e-6)


def test_schedule_edges():
    assert [Chord(mu_peak=0.5, mu_valley=0.2).mu(s) for s in (0, 7)] == [0.2, 0.2]  # no warm-up, no decay: valley
    assert Chord(mu_peak=0.5, mu_valley=0.2, mu_decay_steps=10).mu(0) == 0.5  # no warm-up: starts at the peak


def test_needs_follow_the_rl_loss_and_contracts_hold():
    assert (
        Chord(rl_loss=ClippedPG(beta=0.1)).needs_reference and Chord(rl_loss=ClippedPG(entropy_coeff=0.1)).needs_entropy
    )
    assert Chord(rl_loss=AIPO(teacher_tau=1.0)).needs_teacher and Chord.needs_experts
    check_component(Chord)
    check_loss(Chord(rl_loss=AIPO(teacher_tau=1.0), enable_phi_function=True, mu_peak=0.5))
    check_loss(Chord(rl_loss=ClippedPG(beta=0.1, entropy_coeff=0.01)))


def test_errors_name_the_key():
    with pytest.raises(ValueError, match="data.expert"):
        Chord()(make_loss_inputs([-1.0], [-1.0], [1.0]))
    with pytest.raises(ValueError, match="mu_peak"):
        Chord(mu_peak=1.5)
    with pytest.raises(ValueError, match="mu_warmup_steps"):
        Chord(mu_warmup_steps=-1)
    with pytest.raises(ValueError, match="not another Chord"):
        Chord(rl_loss=Chord())
