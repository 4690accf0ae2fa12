"""CISPO: clipped importance-sampling-weight policy optimisation (MiniMax-M1, MiniMax 2025).

With r_t = exp(logp_t - logq_t) the ratio of the trainer's logprob (with gradient) to the inference
engine's (the behaviour policy) and A_t the token's advantage:

    w_t  = sg[ clip(r_t, 1 - eps_low, 1 + eps_high) ]
    loss = -sum_t w_t A_t logp_t / loss_normalizer            token-level normalisation (as DAPO)

so d loss / d logp_t = -w_t A_t / loss_normalizer on every loss token. Unlike PPO's clip, which zeroes
the gradient of tokens whose ratio left the trust region (often the rare "fork" tokens of a chain of
thought), CISPO keeps every token and only bounds its importance weight.

Defaults: eps_low = 1.0 makes the lower bound 0, i.e. no lower clip, as in the paper (it sets eps_low to
a large value and tunes only eps_high). The paper does not publish its eps_high; eps_high = 4.0 caps the
weight at 5, the eps_max = 5 (a cap on the ratio itself) that TRL documents for CISPO after ScaleRL
(Khatri et al. 2025). Async rollouts push ratios well past 1.28: DAPO's eps_high = 0.28 would give
all such tokens the same weight.

No departure from the paper's objective.
"""

from __future__ import annotations

import torch

from grpokit.loss import Loss, LossInputs
from grpokit.normalization import normalize, token_mean


class CISPO(Loss):
    """REINFORCE weighted by the detached, clipped importance ratio: no token is dropped (MiniMax-M1)."""

    def __init__(self, eps_low: float = 1.0, eps_high: float = 4.0) -> None:
        """
        Args:
            eps_low: the importance weight is clipped below at 1 - eps_low; 1 or more disables the lower clip.
            eps_high: the importance weight is clipped above at 1 + eps_high.
        """
        if eps_low < 0 or eps_high < 0:
            raise ValueError(
                "CISPO needs eps_low >= 0 and eps_high >= 0 (weights clipped "
                f"to [1 - eps_low, 1 + eps_high]); got {eps_low}, {eps_high}"
            )
        self.eps_low = eps_low
        self.eps_high = eps_high

    def __call__(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask_T = inputs.loss_mask_T > 0
        ratio_T = torch.exp((inputs.trainer_logprobs_T.detach() - inputs.inference_logprobs_T) * mask_T)
        weight_T = ratio_T.clamp(1 - self.eps_low, 1 + self.eps_high)
        loss = normalize(-weight_T * inputs.advantages_T * inputs.trainer_logprobs_T, inputs, "token")
        metrics = {
            "clipped_frac": token_mean(weight_T != ratio_T, mask_T),
            "is_weight": token_mean(weight_T, mask_T),
        }
        return loss, metrics
