"""AIPO: token-level importance-masked policy gradient for asynchronous, off-policy GRPO.

With r_t = exp(logp_train_t - logp_infer_t) the trainer/inference importance ratio of token t, A_t
its sequence's advantage, and |i| the loss tokens of sequence i (t in i: token t is one of them):

    s_i     = exp( (1 / |i|) sum_{t in i} log r_t )          geometric-mean sequence ratio
    w_t     = r_t,  l_t = log r_t                            ratio_type "token"
    w_t     = min(s_i, sequence_clip_high),  l_t = log s_i   ratio_type "sequence", t in i
    A'_t    = adv_tau * A_t + teacher_tau * (logp_teacher_t - logp_train_t)
    coeff_t = stopgrad( w_t * (A'_t - kl_tau * l_t) )
    loss    = -sum_{t in keep} coeff_t * logp_train_t / normaliser

so d loss / d logp_train_t = -coeff_t / normaliser. `keep` drops
- tokens whose ratio r_t lies outside [token_mask_low, token_mask_high] (token masking),
- whole sequences whose s_i lies outside [geo_mask_low, geo_mask_high] (geometric sequence masking), and
- whole sequences with min_{t in i} r_t < sequence_mask_low or max_{t in i} r_t > sequence_mask_high
  (min/max sequence masking).
s_i and the min/max run over all of a sequence's loss tokens, token-masked ones included. With
ratio_type "sequence" every kept token of sequence i gets the same weight w_t and log-ratio l_t.

The teacher term is on-policy distillation (Agarwal et al. 2024, "On-Policy Distillation of Language
Models: Learning from Self-Generated Mistakes" (GKD); Thinking Machines 2025, "On-Policy
Distillation"), added to the advantage as prime-rl does: logp_teacher_t - logp_train_t, the negative
of the per-token k1 estimate of KL(policy || teacher), is a per-token reward, so on tokens the policy
sampled itself (w_t = 1) the expected gradient of the loss is teacher_tau * grad KL(policy || teacher)
(E_p[(logp - logq) grad logp], see grpokit.kl): descending it pulls the policy toward the teacher.
logp_teacher_t comes from `model.teacher_model` (a frozen model sharing the policy's tokenizer, scored at
the sampling temperature, like the reference); with teacher_tau > 0 and no teacher logprobs in the
inputs the loss raises.

The normaliser is the number of loss tokens in the whole optimizer step (token-level, as DAPO).
Departures from a plain PPO surrogate: masking instead of clipping (masked tokens give no gradient at
all, as in IcePop / prime-rl's AIPO), and an optional kl_tau term that pulls the policy toward the
sampler on tokens where they disagree. Departures from prime-rl's ratio_type "sequence": its sequence
ratio is the product exp(sum_t log r_t) and its kl term keeps the token log r_t, with the loss further
divided by the sequence's length; here s_i is the length-normalised geometric mean (as GSPO), the kl
term uses log s_i, and the normaliser is the same in both modes.
"""

from __future__ import annotations

from typing import Literal

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
        ratio_type: Literal["token", "sequence"] = "token",
        sequence_mask_low: float = 0.0,
        sequence_mask_high: float = 100.0,
        sequence_clip_high: float = 10.0,
        teacher_tau: float = 0.0,
    ) -> None:
        """
        Args:
            adv_tau: weight of the advantage term.
            kl_tau: weight of the -log-ratio term (0 disables it).
            token_mask_low: tokens with ratio below this are dropped from the loss.
            token_mask_high: tokens with ratio above this are dropped from the loss.
            geo_mask_low: sequences whose geometric-mean ratio is below this are dropped.
            geo_mask_high: sequences whose geometric-mean ratio is above this are dropped.
            ratio_type: "token" weights each token by its own ratio r_t; "sequence" weights every token of
                a sequence by the sequence's geometric-mean ratio s_i (capped at sequence_clip_high), and
                the kl_tau term uses log s_i.
            sequence_mask_low: sequences with any loss token of ratio below this are dropped (0 disables).
            sequence_mask_high: sequences with any loss token of ratio above this are dropped.
            sequence_clip_high: with ratio_type "sequence", the cap on s_i in the weight. It binds only
                for s_i above it that geo_mask_high keeps, so only when geo_mask_high > sequence_clip_high.
            teacher_tau: weight of the teacher-distillation term (log-prob of the teacher minus the
                policy's, a per-token reward); > 0 needs `model.teacher_model`. 0 disables it.
        """
        if not 0 <= token_mask_low <= 1 <= token_mask_high:
            raise ValueError(
                f"AIPO needs token_mask_low <= 1 <= token_mask_high, got {token_mask_low}, {token_mask_high}"
            )
        if not 0 <= geo_mask_low <= 1 <= geo_mask_high:
            raise ValueError(f"AIPO needs geo_mask_low <= 1 <= geo_mask_high, got {geo_mask_low}, {geo_mask_high}")
        if ratio_type not in ("token", "sequence"):
            raise ValueError(f"AIPO needs ratio_type 'token' or 'sequence', got {ratio_type!r}")
        if not 0 <= sequence_mask_low <= 1 <= sequence_mask_high:
            raise ValueError(
                "AIPO needs 0 <= sequence_mask_low <= 1 <= sequence_mask_high, "
                f"got {sequence_mask_low}, {sequence_mask_high}"
            )
        if not sequence_clip_high >= 1:
            raise ValueError(
                f"AIPO needs sequence_clip_high >= 1 (an on-policy sequence has ratio 1), got {sequence_clip_high}"
            )
        if teacher_tau < 0:
            raise ValueError(f"AIPO needs teacher_tau >= 0 (0 disables teacher distillation), got {teacher_tau}")
        self.adv_tau = adv_tau
        self.kl_tau = kl_tau
        self.token_mask_low = token_mask_low
        self.token_mask_high = token_mask_high
        self.geo_mask_low = geo_mask_low
        self.geo_mask_high = geo_mask_high
        self.ratio_type = ratio_type
        self.sequence_mask_low = sequence_mask_low
        self.sequence_mask_high = sequence_mask_high
        self.sequence_clip_high = sequence_clip_high
        self.teacher_tau = teacher_tau
        self.needs_teacher = teacher_tau > 0

    def __call__(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask_T = inputs.loss_mask_T > 0
        seq_ids_T, num_seqs = inputs.seq_ids_T, inputs.num_seqs
        log_ratio_T = (inputs.trainer_logprobs_T.detach() - inputs.inference_logprobs_T) * mask_T
        ratio_T = torch.exp(log_ratio_T)

        token_out_T = (ratio_T < self.token_mask_low) | (ratio_T > self.token_mask_high)
        tokens_N = segment_sum(mask_T.to(log_ratio_T.dtype), seq_ids_T, num_seqs)
        seq_log_ratio_N = segment_sum(log_ratio_T, seq_ids_T, num_seqs) / tokens_N.clamp(min=1)  # log s_i
        geo_ratio_N = torch.exp(seq_log_ratio_N)
        geo_out_N = (geo_ratio_N < self.geo_mask_low) | (geo_ratio_N > self.geo_mask_high)
        # min_t r_t < low  <=>  some loss token has r_t < low (and likewise for max)
        extreme_T = mask_T & ((ratio_T < self.sequence_mask_low) | (ratio_T > self.sequence_mask_high))
        minmax_out_N = segment_sum(extreme_T.to(log_ratio_T.dtype), seq_ids_T, num_seqs) > 0
        keep_T = mask_T & ~token_out_T & ~geo_out_N[seq_ids_T] & ~minmax_out_N[seq_ids_T]

        if self.ratio_type == "sequence":
            kl_log_ratio_T = seq_log_ratio_N[seq_ids_T]
            weight_T = geo_ratio_N.clamp(max=self.sequence_clip_high)[seq_ids_T]
        else:
            kl_log_ratio_T, weight_T = log_ratio_T, ratio_T
        adv_T = self.adv_tau * inputs.advantages_T
        if self.teacher_tau > 0:
            adv_T = adv_T + self.teacher_tau * self._teacher_log_ratio(inputs)
        coeff_T = weight_T * (adv_T - self.kl_tau * kl_log_ratio_T)
        coeff_T = torch.where(
            keep_T, coeff_T, 0.0
        )  # select, not multiply: an overflowed ratio on a dropped token must not give inf * 0 = NaN
        loss = -(coeff_T * inputs.trainer_logprobs_T).sum() / inputs.loss_normalizer

        n_mask = mask_T.sum().clamp(min=1)
        metrics = {
            "masked_frac": ((mask_T & ~keep_T).sum() / n_mask).detach(),
            "token_masked_frac": ((mask_T & token_out_T).sum() / n_mask).detach(),
            "seq_masked_frac": ((mask_T & geo_out_N[seq_ids_T]).sum() / n_mask).detach(),
            "sequence_masked_frac": ((mask_T & minmax_out_N[seq_ids_T]).sum() / n_mask).detach(),
        }
        if self.teacher_tau > 0:  # k1 estimate of KL(policy || teacher) on the sampled tokens
            metrics["teacher_kl"] = -(torch.where(mask_T, self._teacher_log_ratio(inputs), 0.0).sum() / n_mask)
        return loss, metrics

    def _teacher_log_ratio(self, inputs: LossInputs) -> torch.Tensor:
        """logp_teacher_t - logp_train_t, detached (0 off the loss mask)."""
        if inputs.teacher_logprobs_T is None:
            raise ValueError(
                f"AIPO with teacher_tau={self.teacher_tau} needs inputs.teacher_logprobs_T: set model.teacher_model "
                "(a frozen model with the policy's tokenizer), or teacher_tau=0"
            )
        diff_T = inputs.teacher_logprobs_T - inputs.trainer_logprobs_T.detach()
        return torch.where(inputs.loss_mask_T > 0, diff_T, 0.0)
