"""Step metrics shared by the trainer and the orchestrator."""

from __future__ import annotations

import math

import torch


def mismatch_metrics(
    trainer_logprobs_T: torch.Tensor, inference_logprobs_T: torch.Tensor, mask_T: torch.Tensor
) -> dict[str, torch.Tensor]:
    """How far the engine's sampling distribution P_gen is from the trainer's P_policy, on sampled tokens.

    With log r_t = logp_train_t - logp_infer_t (r = P_policy(x_t) / P_gen(x_t), tokens x_t ~ P_gen) and
    the per-token mixture M = (P_policy + P_gen) / 2, each a mean over loss tokens. The names NeMo RL
    uses have NeMo RL's definitions (k3 estimators evaluated on the sampled tokens, no importance weight):
        gen_kl_error              KL(P_gen || P_policy):   r - 1 - log r
        kl                        the same value (short name shown in the progress bar)
        policy_kl_error           KL(P_policy || P_gen):   1/r - 1 + log r
        js_divergence_error       JS(P_policy, P_gen):     0.5 t(l_policy) + 0.5 t(l_gen), with the
                                  per-token term t(l) = exp(l - l_M) - (l - l_M) - 1, l = log P
        token_mult_prob_error     exp(|log r|)            (1.0 = identical)
        sampling_importance_ratio r
        approx_entropy            r * (-logp_train)       (entropy of P_policy, importance-weighted)
    and unbiased estimators of the reverse KL and the JS divergence for tokens sampled from P_gen
    (each term weighted by r, so the mean estimates an expectation under P_policy):
        policy_kl_error_is        1 - r + r log r
        js_divergence_error_is    0.5 log(2 / (1 + r)) + 0.5 r log(2 r / (1 + r))
    All are 0 (or 1 for the ratios) when the two logprobs agree. Computed in float64: 1/r overflows
    float32 once the engine's logprob exceeds the trainer's by ~88.
    """
    mask_T = mask_T.double()
    n = mask_T.sum().clamp(min=1)
    train_T, infer_T = trainer_logprobs_T.double() * mask_T, inference_logprobs_T.double() * mask_T
    log_r_T = train_T - infer_T
    r_T = torch.exp(log_r_T)
    log_m_T = torch.logaddexp(train_T, infer_T) - math.log(2)  # log((P_policy + P_gen) / 2)

    def mean(values_T: torch.Tensor) -> torch.Tensor:
        return (values_T * mask_T).sum() / n

    def to_mixture(log_p_T: torch.Tensor) -> torch.Tensor:  # NeMo's per-token term of JS
        return torch.exp(log_p_T - log_m_T) - (log_p_T - log_m_T) - 1

    gen_kl = mean(r_T - 1 - log_r_T)
    return {
        "kl": gen_kl,
        "gen_kl_error": gen_kl,
        "policy_kl_error": mean(torch.exp(-log_r_T) - 1 + log_r_T),
        "js_divergence_error": mean(0.5 * to_mixture(train_T) + 0.5 * to_mixture(infer_T)),
        "policy_kl_error_is": mean(1 - r_T + r_T * log_r_T),
        "js_divergence_error_is": mean(0.5 * torch.log(2 / (1 + r_T)) + 0.5 * r_T * torch.log(2 * r_T / (1 + r_T))),
        "token_mult_prob_error": mean(torch.exp(log_r_T.abs())),
        "sampling_importance_ratio": mean(r_T),
        "approx_entropy": mean(r_T * -trainer_logprobs_T.double()),
    }


def weighted_mean(metrics: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, float]:
    """Average each metric over the micro-batches that report it, weighted by their loss tokens (a
    micro-batch without a metric, such as Chord's expert_nll where it holds no expert sequence, does not
    count as a 0)."""
    names = {k for m in metrics for k in m}
    totals = {k: sum(w for m, w in zip(metrics, weights) if k in m) or 1.0 for k in names}
    return {k: sum(float(m[k]) * w for m, w in zip(metrics, weights) if k in m) / totals[k] for k in sorted(names)}
