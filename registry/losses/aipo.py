"""AIPO: token-level importance-masked policy gradient for asynchronous, off-policy GRPO.

With r_t = exp(logp_train_t - logp_infer_t) the trainer/inference importance ratio of token t and A_t
its sequence's advantage:

    coeff_t = stopgrad( r_t * (adv_tau * A_t - kl_tau * log r_t) )
    loss    = -sum_{t in keep} coeff_t * logp_train_t / normaliser

so d loss / d logp_train_t = -coeff_t / normaliser. `keep` drops
- tokens whose ratio lies outside [token_mask_low, token_mask_high] (token masking), and
- whole sequences whose geometric-mean ratio exp(mean_t log r_t) lies outside
  [geo_mask_low, geo_mask_high] (geometric sequence masking).

The normaliser is the number of loss tokens in the whole optimizer step (token-level, as DAPO).
Departures from a plain PPO surrogate: masking instead of clipping (masked tokens give no gradient at
all, as in IcePop / prime-rl's AIPO), and an optional kl_tau term that pulls the policy toward the
sampler on tokens where they disagree.
"""

from __future__ import annotations

import torch

from grpokit.loss import Loss, LossInputs, segment_sum


class AIPO(Loss):
    """Token-level importance-masked policy gradient (default GRPO loss)."""

    def __init__(
        self,
        adv_tau: float = 1.0,
        kl_tau: float = 0.0,
        token_mask_low: float = 0.125,
        token_mask_high: float = 8.0,
        geo_mask_low: float = 0.1,
        geo_mask_high: float = 10.0,
    ) -> None:
        """
        Args:
            adv_tau: weight of the advantage term.
            kl_tau: weight of the -log r term (0 disables it).
            token_mask_low: tokens with ratio below this are dropped from the loss.
            token_mask_high: tokens with ratio above this are dropped from the loss.
            geo_mask_low: sequences whose geometric-mean ratio is below this are dropped.
            geo_mask_high: sequences whose geometric-mean ratio is above this are dropped.
        """
        if not 0 <= token_mask_low <= 1 <= token_mask_high:
            raise ValueError(f"AIPO needs token_mask_low <= 1 <= token_mask_high, got {token_mask_low}, {token_mask_high}")
        if not 0 <= geo_mask_low <= 1 <= geo_mask_high:
            raise ValueError(f"AIPO needs geo_mask_low <= 1 <= geo_mask_high, got {geo_mask_low}, {geo_mask_high}")
        self.adv_tau = adv_tau
        self.kl_tau = kl_tau
        self.token_mask_low = token_mask_low
        self.token_mask_high = token_mask_high
        self.geo_mask_low = geo_mask_low
        self.geo_mask_high = geo_mask_high

    def __call__(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask_T = inputs.loss_mask_T > 0
        log_ratio_T = (inputs.trainer_logprobs_T.detach() - inputs.inference_logprobs_T) * mask_T
        ratio_T = torch.exp(log_ratio_T)

        token_out_T = (ratio_T < self.token_mask_low) | (ratio_T > self.token_mask_high)
        tokens_N = segment_sum(mask_T.to(log_ratio_T.dtype), inputs.seq_ids_T, inputs.num_seqs)
        geo_ratio_N = torch.exp(segment_sum(log_ratio_T, inputs.seq_ids_T, inputs.num_seqs) / tokens_N.clamp(min=1))
        seq_out_N = (geo_ratio_N < self.geo_mask_low) | (geo_ratio_N > self.geo_mask_high)
        keep_T = mask_T & ~token_out_T & ~seq_out_N[inputs.seq_ids_T]

        coeff_T = ratio_T * (self.adv_tau * inputs.advantages_T - self.kl_tau * log_ratio_T)
        loss = -(coeff_T * inputs.trainer_logprobs_T * keep_T).sum() / inputs.loss_normalizer

        n_mask = mask_T.sum().clamp(min=1)
        metrics = {
            "masked_frac": ((mask_T & ~keep_T).sum() / n_mask).detach(),
            "token_masked_frac": ((mask_T & token_out_T).sum() / n_mask).detach(),
            "seq_masked_frac": ((mask_T & seq_out_N[inputs.seq_ids_T]).sum() / n_mask).detach(),
        }
        return loss, metrics
