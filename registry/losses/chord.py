"""CHORD (Zhang et al. 2025, "On-Policy RL Meets Off-Policy Experts: Harmonizing Supervised Fine-Tuning
and Reinforcement Learning via Dynamic Weighting", arXiv 2508.11408): RL on sampled rollouts plus SFT on
expert completions, with a scheduled weight.

    loss   = (1 - mu(s)) * L_rl + mu(s) * L_sft
    L_sft  = -sum_{t in E} phi_t * logp_train_t / |E_step|
    phi_t  = 1,  or  sg[p_t (1 - p_t)] with p_t = exp(logp_train_t)     (enable_phi_function, CHORD-phi)
    mu(s)  = mu_peak * s / mu_warmup_steps                                           s < W
           = mu_valley + (mu_peak - mu_valley) * 0.5 * (1 + cos(pi * (s - W) / D))    W <= s < W + D
           = mu_valley                                                               s >= W + D

with s the trainer step, W = mu_warmup_steps, D = mu_decay_steps, L_rl any other registered loss
(`rl_loss`) on the sampled tokens, E the expert tokens of this micro-batch (`inputs.expert_mask_T`) and
|E_step| those of the whole optimizer step (`inputs.expert_normalizer`), so L_sft is a token mean over
the step, as in Trinity-RFT's `mix_chord` (use_token_level_loss). The expert completions come from the
orchestrator (`data.expert`, grpokit/orchestrator/experts.py): the example's reference answer, one per group,
or `per_step` records a step of a separate SFT dataset (`data.expert.path`, ms-swift's chord_sft_dataset),
whose assistant tokens are the expert tokens; they are outside the RL loss mask, so they never get an advantage.

CHORD-phi down-weights tokens the policy already predicts with near certainty (p -> 1) and ones it finds
very unlikely (p -> 0), so imitation disturbs the policy's exploration less; d L_sft / d logp_t = -phi_t / |E_step|.

Departures: mu is a function of the trainer step, as Trinity-RFT's schedule (linear warm-up from 0, then
cosine decay); the paper also studies a fixed mu. Trinity-RFT normalises the two terms by configured
batch sizes of usual and expert experiences; here each term by its own token count of the step. The
metric `expert_nll` is the mean -logp over a micro-batch's expert tokens, reported by micro-batches that
hold any and averaged over them by loss tokens like every metric: approximate, and a micro-batch holding
only expert sequences (no loss tokens) does not count in it.
"""

from __future__ import annotations

import math

import torch

from grpokit.loss import Loss, LossInputs


class Chord(Loss):
    """CHORD: (1 - mu) * an RL loss + mu * SFT on expert completions, mu warmed up then cosine-decayed."""

    needs_experts = True

    def __init__(
        self,
        rl_loss: Loss | None = None,
        mu_peak: float = 0.1,
        mu_valley: float = 0.1,
        mu_warmup_steps: int = 0,
        mu_decay_steps: int = 0,
        enable_phi_function: bool = False,
    ) -> None:
        """
        Args:
            rl_loss: the policy loss on sampled rollouts (kind `loss`, any but Chord; default ClippedPG, as
                the paper's GRPO).
            mu_peak: SFT weight at the end of the warm-up.
            mu_valley: SFT weight after the decay.
            mu_warmup_steps: steps of linear warm-up of mu from 0 to mu_peak (0: start at mu_peak).
            mu_decay_steps: steps of cosine decay from mu_peak to mu_valley (0: mu_valley right after the warm-up).
            enable_phi_function: weight each expert token's SFT term by p (1 - p) (CHORD-phi).
        """
        if rl_loss is None:
            from grpokit.registry.losses.clipped_pg import ClippedPG

            rl_loss = ClippedPG()
        if isinstance(rl_loss, Chord):
            raise ValueError("Chord's rl_loss must be an RL loss on sampled rollouts, not another Chord")
        if not (0 <= mu_peak <= 1 and 0 <= mu_valley <= 1):
            raise ValueError(
                "Chord needs 0 <= mu_peak <= 1 and 0 <= mu_valley <= 1 "
                f"(weights of the SFT term), got {mu_peak}, {mu_valley}"
            )
        if mu_warmup_steps < 0 or mu_decay_steps < 0:
            raise ValueError(
                f"Chord needs mu_warmup_steps >= 0 and mu_decay_steps >= 0, got {mu_warmup_steps}, {mu_decay_steps}"
            )
        self.rl_loss = rl_loss
        self.mu_peak, self.mu_valley = mu_peak, mu_valley
        self.mu_warmup_steps, self.mu_decay_steps = mu_warmup_steps, mu_decay_steps
        self.enable_phi_function = enable_phi_function
        self.needs_reference = rl_loss.needs_reference
        self.needs_entropy = rl_loss.needs_entropy
        self.needs_teacher = rl_loss.needs_teacher

    def mu(self, step: int) -> float:
        """The SFT weight at trainer step `step` (see the module docstring)."""
        if step < self.mu_warmup_steps:
            return self.mu_peak * step / self.mu_warmup_steps
        if step >= self.mu_warmup_steps + self.mu_decay_steps:
            return self.mu_valley
        cosine = 0.5 * (1 + math.cos(math.pi * (step - self.mu_warmup_steps) / self.mu_decay_steps))
        return self.mu_valley + (self.mu_peak - self.mu_valley) * cosine

    def __call__(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if inputs.expert_mask_T is None:
            raise ValueError(
                "Chord needs inputs.expert_mask_T (the expert tokens); "
                "the trainer sets it: set data.expert in the recipe"
            )
        rl, metrics = self.rl_loss(inputs)
        expert_T = inputs.expert_mask_T > 0
        logp_T = inputs.trainer_logprobs_T
        phi_T = (
            (logp_T.detach().exp() * (1 - logp_T.detach().exp()))
            if self.enable_phi_function
            else torch.ones_like(logp_T)
        )
        sft = -torch.where(expert_T, phi_T * logp_T, 0.0).sum() / inputs.expert_normalizer
        mu = self.mu(inputs.step)
        metrics["mu"] = torch.tensor(mu)
        if expert_T.any():
            metrics["expert_nll"] = -torch.where(expert_T, logp_T.detach(), 0.0).sum() / expert_T.sum()
        return (1 - mu) * rl + mu * sft, metrics
