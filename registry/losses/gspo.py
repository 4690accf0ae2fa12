"""GSPO: Group Sequence Policy Optimization (Zheng et al. 2025), in its GSPO-token form.

With |y_i| the loss tokens of sequence i, A_i its advantage, logp the trainer's logprobs (with gradient)
and logq the inference engine's (the behaviour policy):

    s_i   = exp( (1 / |y_i|) sum_{t in y_i} (logp_t - logq_t) )        length-normalised sequence ratio
    s_i,t = sg[s_i] * exp(logp_t - sg[logp_t])                          value s_i, gradient s_i grad logp_t
    l_i,t = -min(s_i,t A_i, clip(s_i,t, 1 - eps_low, 1 + eps_high) A_i)
    loss  = sum_i (1 / |y_i|) sum_t l_i,t / step_num_seqs               sequence-level normalisation

The clip acts on whole sequences: when s_i leaves the range on the side its advantage favours, all of
the sequence's tokens give no gradient. Unclipped, GSPO-token's gradient equals GSPO's (the sequence
form), -s_i A_i (1 / |y_i|) sum_t grad logp_t, per sequence; the token form also allows per-token
advantages. Defaults eps_low = 3e-4, eps_high = 4e-4 are the paper's.

Overflow: the sequence log-ratio is capped at U = 20 + log(1 + eps_high) before exp() (its value only:
it is detached). Below U nothing changes, bit for bit. Above it, a sequence with A_i > 0 is clipped
anyway (same loss, gradient exactly 0, where uncapped float32 exp() overflows past 88.7 and 0 * inf gives
a NaN gradient that skips the whole optimizer step); one with A_i < 0, which no clip bounds, is weighted
as if s_i = e^U (about 5e8: a sequence that far off-policy is broken, and e^U |A_i| keeps the backward and
the squared gradient norm finite in float32).

Departure: the "old" policy is the inference engine that sampled the tokens, so s_i also carries the
trainer/engine mismatch (the paper computes it against the trainer's old policy).
"""

from __future__ import annotations

import math

import torch

from grpokit.loss import Loss, LossInputs, segment_sum
from grpokit.normalization import normalize, token_mean


class GSPO(Loss):
    """Sequence-level clipped importance ratio (geometric mean over tokens), sequence-mean normalisation."""

    def __init__(self, eps_low: float = 3e-4, eps_high: float = 4e-4) -> None:
        """
        Args:
            eps_low: the sequence ratio is clipped below at 1 - eps_low (for negative advantages).
            eps_high: the sequence ratio is clipped above at 1 + eps_high (for positive advantages).
        """
        if eps_low < 0 or eps_high < 0:
            raise ValueError(
                f"GSPO needs eps_low >= 0 and eps_high >= 0 (the paper uses 3e-4 and 4e-4); got {eps_low}, {eps_high}"
            )
        self.eps_low = eps_low
        self.eps_high = eps_high
        # Cap on the sequence log-ratio before exp(): e^20 past the upper clip bound (see the module docstring).
        self.max_log_ratio = 20.0 + math.log1p(eps_high)

    def __call__(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask_T = inputs.loss_mask_T > 0
        logp_T, adv_T, seq_ids_T = inputs.trainer_logprobs_T, inputs.advantages_T, inputs.seq_ids_T
        log_ratio_T = (logp_T.detach() - inputs.inference_logprobs_T) * mask_T
        tokens_N = segment_sum(mask_T.to(log_ratio_T.dtype), seq_ids_T, inputs.num_seqs)
        seq_log_ratio_N = segment_sum(log_ratio_T, seq_ids_T, inputs.num_seqs) / tokens_N.clamp(min=1)
        seq_log_ratio_N = seq_log_ratio_N.clamp(max=self.max_log_ratio)
        ratio_T = torch.exp(seq_log_ratio_N[seq_ids_T] + (logp_T - logp_T.detach()) * mask_T)

        clip_high_T = (ratio_T.detach() > 1 + self.eps_high) & (adv_T > 0)
        clip_low_T = (ratio_T.detach() < 1 - self.eps_low) & (adv_T < 0)
        obj_T = torch.minimum(ratio_T * adv_T, ratio_T.clamp(1 - self.eps_low, 1 + self.eps_high) * adv_T)
        loss = normalize(-obj_T, inputs, "sequence")
        metrics = {
            "clipped_frac": token_mean(clip_high_T | clip_low_T, mask_T),
            "clip_high_frac": token_mean(clip_high_T, mask_T),
            "clip_low_frac": token_mean(clip_low_T, mask_T),
            "seq_ratio": token_mean(ratio_T, mask_T),
        }
        return loss, metrics
