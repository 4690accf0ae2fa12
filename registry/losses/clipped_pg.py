"""PPO/GRPO clipped surrogate (Schulman et al. 2017, PPO; Shao et al. 2024, GRPO) with the usual extensions.

Per loss token t, with A_t its sequence's advantage and logp_t the trainer's logprob (with gradient):

    r_t   = exp(logp_t - logp_old_t)
    obj_t = min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)
    obj_t = max(obj_t, c A_t)          only where A_t < 0, when ratio_clip_c = c is set
    l_t   = -w_t obj_t + beta v_t KL_t
    loss  = normalize(l, normalization)        (grpokit.normalization: token, sequence, constant, bnpo)

- logp_old_t is the inference engine's logprob (the behaviour policy of async GRPO) and w_t = 1.
  With use_importance_sampling_correction, logp_old_t = sg[logp_t] (r_t = 1 in value, gradient
  grad logp_t, so the clip never binds: the trainer is its own "old" policy, one optimizer step per batch)
  and w_t = sg[min(exp(logp_t - logp_infer_t), is_cap)] corrects for the trainer/engine mismatch
  (truncated importance sampling, Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
  Off-Policy RL Training").
- eps_high > eps_low is DAPO's clip-higher (Yu et al. 2025, eps_high = 0.28).
- Dual-clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL"): for A_t < 0 the
  objective max(min(r A, clip(r) A), c A) stops a huge ratio from giving an unbounded loss; in the
  minimisation form used by verl, l_t = min(max(-r A, -clip(r) A), -c A).
- KL_t is k1, k2 or k3 (grpokit.kl) between the policy and the reference, as a loss term as in GRPO
  (which uses k3). v_t = 1, or sg[exp(logp_t - logp_infer_t)] with use_on_policy_kl_approximation: the
  tokens were sampled by the engine, so reweighting makes the estimate one of KL(policy || reference).
- overlong_filtering (DAPO): tokens of sequences cut at max_tokens get l_t = 0.
- entropy bonus: l_t -= entropy_coeff * H_t (H_t the policy's full-vocabulary entropy at token t).

Overflow: every log-ratio (logp_t - logp_old_t, and the detached logp_t - logp_infer_t of the IS and KL
weights) is capped at U = 20 + max(log(1 + eps_high), log(ratio_clip_c), log(is_cap)) before exp(),
the cap applied to its detached value only, so the gradient still flows as grad logp_t. U is beyond
every bound the loss compares a ratio with, so below it nothing changes (bit for bit), and above it:
a token with A_t > 0 (or A_t < 0 under dual-clip) is clipped anyway, so its loss is the same and its
gradient exactly 0 (uncapped, float32 exp() overflows past 88.7 and 0 * inf gives a NaN gradient,
which skips the whole optimizer step); an A_t = 0 token stays at 0; an A_t < 0 token without dual-clip,
whose objective r_t A_t is unbounded, is weighted as if r_t = e^U (about 5e8 times the bound: a token that
far off-policy is broken, and e^U |A_t| keeps the backward and the squared gradient norm finite in float32).

Departures: overlong filtering keeps the truncated sequences in the step's denominators
(loss_normalizer, step_num_seqs), where DAPO removes them, so the other tokens weigh slightly less.
The KL term is normalised with the policy term, by the same mode.
"""

from __future__ import annotations

import math

import torch

from grpokit.kl import ESTIMATORS, KLEstimator
from grpokit.loss import Loss, LossInputs
from grpokit.normalization import Normalization, check_normalization, normalize, token_mean


class ClippedPG(Loss):
    """PPO/GRPO clipped surrogate: clip-higher, dual-clip, KL to a reference, truncated IS, overlong filter."""

    def __init__(
        self,
        eps_low: float = 0.2,
        eps_high: float = 0.2,
        ratio_clip_c: float | None = None,
        beta: float = 0.0,
        kl_estimator: KLEstimator = "k3",
        use_on_policy_kl_approximation: bool = False,
        use_importance_sampling_correction: bool = False,
        is_cap: float = 2.0,
        overlong_filtering: bool = False,
        normalization: Normalization = "token",
        max_tokens_normalizer: int | None = None,
        entropy_coeff: float = 0.0,
    ) -> None:
        """
        Args:
            eps_low: the ratio is clipped below at 1 - eps_low (for negative advantages); 1 or more
                disables the lower clip.
            eps_high: the ratio is clipped above at 1 + eps_high (for positive advantages); DAPO's
                clip-higher uses 0.28.
            ratio_clip_c: dual-clip bound c > 1: where the advantage is negative the objective is at
                least c * A (null disables it).
            beta: weight of the KL penalty to the reference policy (0 disables it and loads no
                reference model).
            kl_estimator: per-token KL estimator, k1, k2 or k3 (see grpokit.kl).
            use_on_policy_kl_approximation: weight the KL term by the detached ratio of policy to
                sampling (inference) probability, so it estimates the KL under the policy's own samples.
            use_importance_sampling_correction: take the ratio against the detached trainer logprobs and
                weight each token by the truncated trainer/inference ratio (truncated importance
                sampling) instead of taking the ratio against the inference logprobs.
            is_cap: upper bound of the truncated importance-sampling weight.
            overlong_filtering: sequences cut at max_tokens without a stop contribute no loss (DAPO).
            normalization: how per-token terms are aggregated: token (DAPO), sequence (GRPO), constant
                (Dr. GRPO) or bnpo (see grpokit.normalization).
            max_tokens_normalizer: the constant of normalization='constant' (Dr. GRPO uses the
                generation budget, max_tokens); only with that mode.
            entropy_coeff: weight of an entropy bonus, l_t -= entropy_coeff * H_t, with H_t the policy's
                predictive entropy at token t (0 disables it). It costs one more [tokens, vocab]
                float32 tensor per micro-batch, kept for backward.
        """
        if eps_low < 0 or eps_high < 0:
            raise ValueError(
                "ClippedPG needs eps_low >= 0 and eps_high >= 0 (clip bounds "
                f"1 - eps_low, 1 + eps_high); got {eps_low}, {eps_high}"
            )
        if ratio_clip_c is not None and ratio_clip_c <= 1:
            raise ValueError(
                "ratio_clip_c must be > 1 (dual-clip bounds the loss at c * "
                f"|A|; Ye et al. use 3), or null to disable; got {ratio_clip_c}"
            )
        if beta < 0:
            raise ValueError(f"beta must be >= 0 (0 disables the KL penalty); got {beta}")
        if kl_estimator not in ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {', '.join(ESTIMATORS)}; got {kl_estimator!r}")
        if use_on_policy_kl_approximation and beta == 0:
            raise ValueError(
                "use_on_policy_kl_approximation weights the KL term, "
                "which beta=0 disables: set beta > 0 or leave it false"
            )
        if is_cap < 1:
            raise ValueError(
                "is_cap must be >= 1 (it caps the importance weight; "
                f"below 1 it would shrink on-policy tokens); got {is_cap}"
            )
        check_normalization(normalization, max_tokens_normalizer)
        self.eps_low = eps_low
        self.eps_high = eps_high
        self.ratio_clip_c = ratio_clip_c
        self.beta = beta
        self.kl_estimator = kl_estimator
        self.use_on_policy_kl_approximation = use_on_policy_kl_approximation
        self.use_importance_sampling_correction = use_importance_sampling_correction
        self.is_cap = is_cap
        self.overlong_filtering = overlong_filtering
        self.normalization = normalization
        self.max_tokens_normalizer = max_tokens_normalizer
        if entropy_coeff < 0:
            raise ValueError(f"entropy_coeff must be >= 0 (it is a bonus; 0 disables it); got {entropy_coeff}")
        self.entropy_coeff = entropy_coeff
        self.needs_reference = beta > 0
        self.needs_entropy = entropy_coeff > 0
        bounds = [math.log1p(eps_high), math.log(ratio_clip_c or 1.0), math.log(is_cap)]
        # Cap on log-ratios before exp(): e^20 past the largest ratio bound (see the module docstring).
        self.max_log_ratio = 20.0 + max(bounds)

    def __call__(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask_T = inputs.loss_mask_T > 0
        logp_T, adv_T = inputs.trainer_logprobs_T, inputs.advantages_T
        # log(pi_train / pi_infer) without gradient; 0 off the loss mask so exp() stays finite there.
        train_infer_T = ((logp_T.detach() - inputs.inference_logprobs_T) * mask_T).clamp(max=self.max_log_ratio)
        metrics: dict[str, torch.Tensor] = {}
        if self.use_importance_sampling_correction:
            old_T = logp_T.detach()
            weight_T = torch.exp(train_infer_T).clamp(max=self.is_cap)
            metrics["is_capped_frac"] = token_mean(weight_T == self.is_cap, mask_T)
        else:
            old_T, weight_T = inputs.inference_logprobs_T, torch.ones_like(train_infer_T)

        # value min(logp - old, U), gradient grad logp: a clipped token's 0 gradient never meets exp()'s inf.
        log_ratio_T = (logp_T.detach() - old_T).clamp(max=self.max_log_ratio) + (logp_T - logp_T.detach())
        ratio_T = torch.exp(log_ratio_T * mask_T)
        clip_high_T = (ratio_T.detach() > 1 + self.eps_high) & (adv_T > 0)
        clip_low_T = (ratio_T.detach() < 1 - self.eps_low) & (adv_T < 0)
        obj_T = torch.minimum(ratio_T * adv_T, ratio_T.clamp(1 - self.eps_low, 1 + self.eps_high) * adv_T)
        if self.ratio_clip_c is not None:
            dual_T = (adv_T < 0) & (obj_T.detach() < self.ratio_clip_c * adv_T)
            obj_T = torch.where(dual_T, self.ratio_clip_c * adv_T, obj_T)
            metrics["dual_clipped_frac"] = token_mean(dual_T, mask_T)
        loss_T = -weight_T * obj_T
        if self.entropy_coeff > 0:
            if inputs.entropy_T is None:
                raise ValueError(
                    "ClippedPG with entropy_coeff > 0 needs inputs.entropy_T; "
                    "the trainer sets it when needs_entropy is True"
                )
            loss_T = loss_T - self.entropy_coeff * inputs.entropy_T
            metrics["entropy"] = token_mean(inputs.entropy_T.detach(), mask_T)

        if self.beta > 0:
            kl_T = self._kl(inputs, mask_T, train_infer_T)
            loss_T = loss_T + self.beta * kl_T
            metrics["ref_kl"] = token_mean(kl_T, mask_T)
        if self.overlong_filtering:
            truncated_T = self._truncated(inputs)
            loss_T = torch.where(truncated_T, 0.0, loss_T)
            metrics["masked_frac"] = token_mean(truncated_T, mask_T)

        loss = normalize(loss_T, inputs, self.normalization, self.max_tokens_normalizer)
        metrics["clipped_frac"] = token_mean(clip_high_T | clip_low_T, mask_T)
        metrics["clip_high_frac"] = token_mean(clip_high_T, mask_T)
        metrics["clip_low_frac"] = token_mean(clip_low_T, mask_T)
        return loss, metrics

    def _kl(self, inputs: LossInputs, mask_T: torch.Tensor, train_infer_T: torch.Tensor) -> torch.Tensor:
        """Per-token KL estimate to the reference (0 off the loss mask), importance-weighted when asked."""
        if inputs.ref_logprobs_T is None:
            raise ValueError(
                "ClippedPG with beta > 0 needs inputs.ref_logprobs_T (the reference policy's logprobs); the trainer "
                "sets it when the loss has needs_reference = True: build LossInputs with ref_logprobs_T, or set beta=0"
            )
        logp_T = inputs.trainer_logprobs_T
        # Off the mask the reference is set to the policy, so an extreme gap there cannot overflow the backward.
        ref_T = torch.where(mask_T, inputs.ref_logprobs_T, logp_T.detach())
        kl_T = ESTIMATORS[self.kl_estimator](logp_T, ref_T)
        if self.use_on_policy_kl_approximation:
            kl_T = torch.exp(train_infer_T) * kl_T
        return kl_T

    def _truncated(self, inputs: LossInputs) -> torch.Tensor:
        """True on the tokens of sequences cut at max_tokens."""
        if inputs.is_truncated_N is None:
            raise ValueError(
                "overlong_filtering needs inputs.is_truncated_N (which "
                "sequences hit max_tokens); set overlong_filtering=false"
            )
        return inputs.is_truncated_N.to(device=inputs.seq_ids_T.device, dtype=torch.bool)[inputs.seq_ids_T]
