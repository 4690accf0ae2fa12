"""Step metrics shared by the trainer and the orchestrator."""

from __future__ import annotations

import torch


def mismatch_metrics(trainer_logprobs_T: torch.Tensor, inference_logprobs_T: torch.Tensor, mask_T: torch.Tensor) -> dict[str, torch.Tensor]:
    """How far the engine's sampling distribution is from the trainer's on the sampled tokens.

    kl: k3 estimate of KL(pi_infer || pi_train), mean over loss tokens of r - 1 - log r with
    r = p_train / p_infer. token_mult_prob_error: mean of exp(|logp_train - logp_infer|) (1.0 = identical).
    """
    n = mask_T.sum().clamp(min=1)
    log_ratio_T = (trainer_logprobs_T - inference_logprobs_T) * mask_T
    k3_T = torch.exp(log_ratio_T) - 1 - log_ratio_T
    return {
        "kl": (k3_T * mask_T).sum() / n,
        "token_mult_prob_error": (torch.exp(log_ratio_T.abs()) * mask_T).sum() / n,
    }


def weighted_mean(metrics: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, float]:
    """Average each metric over micro-batches, weighted by their loss tokens."""
    total = sum(weights) or 1.0
    names = {k for m in metrics for k in m}
    return {k: sum(float(m[k]) * w for m, w in zip(metrics, weights) if k in m) / total for k in sorted(names)}
