"""Step metrics shared by the trainer and the orchestrator."""

from __future__ import annotations

import torch


def mismatch_metrics(
    trainer_logprobs_T: torch.Tensor, inference_logprobs_T: torch.Tensor, mask_T: torch.Tensor
) -> dict[str, torch.Tensor]:
    """How far the engine's sampling distribution P_gen is from the trainer's P_policy, on sampled tokens.

    With r_t = P_policy(x_t) / P_gen(x_t) = exp(logp_train_t - logp_infer_t) and tokens x_t ~ P_gen,
    each a mean over loss tokens:
        gen_kl_error              KL(P_gen || P_policy), k3 form:       r - 1 - log r
        kl                        the same value (short name shown in the progress bar)
        policy_kl_error           KL(P_policy || P_gen), importance-weighted k3:  1 - r + r log r
        js_divergence_error       JS(P_gen, P_policy):  0.5 log(2 / (1 + r)) + 0.5 r log(2 r / (1 + r))
        token_mult_prob_error     exp(|log r|)            (1.0 = identical)
        sampling_importance_ratio r
        approx_entropy            r * (-logp_train)       (entropy of P_policy, importance-weighted)
    Estimators are per sampled token (not the full-vocabulary divergence); all are 0 (or 1 for the
    ratios) when the two logprobs agree.
    """
    n = mask_T.sum().clamp(min=1)
    log_r_T = (trainer_logprobs_T - inference_logprobs_T) * mask_T
    r_T = torch.exp(log_r_T)

    def mean(values_T: torch.Tensor) -> torch.Tensor:
        return (values_T * mask_T).sum() / n

    gen_kl = mean(r_T - 1 - log_r_T)
    return {
        "kl": gen_kl,
        "gen_kl_error": gen_kl,
        "policy_kl_error": mean(1 - r_T + r_T * log_r_T),
        "js_divergence_error": mean(0.5 * torch.log(2 / (1 + r_T)) + 0.5 * r_T * torch.log(2 * r_T / (1 + r_T))),
        "token_mult_prob_error": mean(torch.exp(log_r_T.abs())),
        "sampling_importance_ratio": mean(r_T),
        "approx_entropy": mean(r_T * -trainer_logprobs_T),
    }


def weighted_mean(metrics: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, float]:
    """Average each metric over the micro-batches that report it, weighted by their loss tokens (a
    micro-batch without a metric, such as Chord's expert_nll where it holds no expert sequence, does not
    count as a 0)."""
    names = {k for m in metrics for k in m}
    totals = {k: sum(w for m, w in zip(metrics, weights) if k in m) or 1.0 for k in names}
    return {k: sum(float(m[k]) * w for m, w in zip(metrics, weights) if k in m) / totals[k] for k in sorted(names)}
