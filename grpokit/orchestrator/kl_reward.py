"""KL-in-reward (`data.kl_in_reward`): a KL penalty to the initial policy folded into each rollout's
reward before advantages, as verl's `algorithm.use_kl_in_reward` and ms-swift's `kl_in_reward` do.

For rollout i with completion tokens t where completion_mask_t = 1 (the tokens the policy wrote and
the loss trains on), logp_t the engine's logprob of the sampled token (Rollout.completion_logprobs)
and logq_t the reference model's logprob of the same token at the same sampling temperature:

    KL_seq(i)  = sum_{t : mask_t = 1} k(logp_t, logq_t)        k = k1, k2 or k3 (grpokit.kl), default k1
    reward'_i  = reward_i - coef * KL_seq(i)

and the advantage (kind `advantage`) is computed from reward' instead of reward. k1 = logp - logq, so
the default subtracts coef times the sequence's log-likelihood ratio to the reference: the per-sequence
single-sample estimate of KL(pi_behaviour || pi_ref) that PPO-style RLHF puts in the reward.

The reference is the policy's initial model: the model the recipe's `model.model` names, loaded here
once on first use (for a LoRA run that is the base model, the policy with its adapter off), frozen,
float32, on the CPU, in the orchestrator's process. It scores the tokens on rows packed end to end
(grpokit.common.logprobs.packed_token_logprobs, shared prompts run once) with the LM head only on the
trained completion tokens. Rollouts whose prompts hold images (Rollout.vision) are packed on rows of their
own and scored as the trainer scores them: the same call with the row's image inputs
(grpokit.vision.inputs.concat), the model's own positions (grpokit.vision.positions: the Qwen-VL
family's 3-D ones) and no prefix sharing (a prompt's images are not in its token ids, so equal ids do
not make equal prefixes); text rows keep their shared prompts.

Departures, and why:
- verl takes logp from the actor's recomputation of the behaviour logprobs; the orchestrator has no
  trainer model, so logp is the engine's. With engine/trainer mismatch (bf16 engines, a repetition
  penalty: docs/orchestrator.md) KL_seq includes that mismatch, and at step 0 it is the mismatch alone.
- Only the advantages see reward'. The environment's rewards stay what the reward metrics, the
  easy/hard pools, samples.jsonl and the buffer rules read (online_difficulty_filtering and
  dynamic_sampling: a group's env rewards all equal is what they test; shaped rewards are almost never
  equal, so on reward' the rules would keep every group and the reference would score groups that are
  then dropped). verl's DAPO filter reads env scores by default too (`filter_groups.metric: acc`).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace

import torch

from grpokit.common.logprobs import packed_token_logprobs
from grpokit.common.models import load_causal_lm
from grpokit.kl import ESTIMATORS, KLEstimator
from grpokit.types import Rollout
from grpokit.vision.inputs import concat

log = logging.getLogger(__name__)


@dataclass
class KLInRewardSettings:
    """A KL penalty to the initial policy subtracted from each rollout's reward before advantages.

    Args:
        coef: the penalty's weight: reward - coef * KL_seq (verl's kl_ctrl.kl_coef default, 0.001).
        estimator: per-token KL estimator summed over the completion's trained tokens (grpokit.kl):
            k1 = logp - logq (verl's `kl`), k2 = 0.5 (logp - logq)^2 (`mse`), k3 = exp(logq - logp)
            - (logq - logp) - 1 (`low_var_kl`, which verl also clamps to [-10, 10] a token; not here),
            with logp the engine's and logq the reference's logprob.
    """

    coef: float = 0.001
    estimator: KLEstimator = "k1"

    def __post_init__(self) -> None:
        if not 0 <= self.coef < math.inf:  # NaN fails too
            raise ValueError(
                f"data.kl_in_reward.coef must be a finite number >= 0, got {self.coef!r}; "
                "set e.g. 0.001, or data.kl_in_reward: null to turn the penalty off"
            )
        if self.estimator not in ESTIMATORS:
            raise ValueError(
                f"data.kl_in_reward.estimator must be one of {', '.join(ESTIMATORS)} (grpokit.kl), "
                f"got {self.estimator!r}"
            )


def sequence_kl(rollouts: list[Rollout], ref_logprobs: list[torch.Tensor], estimator: str) -> torch.Tensor:
    """KL_seq of each rollout, [N] float64: the estimator summed over its completion_mask-1 tokens
    (tokens outside the mask never enter the sum, so an estimator's value there cannot poison it)."""
    kl_N = torch.zeros(len(rollouts), dtype=torch.float64)
    for i, (r, logq_C) in enumerate(zip(rollouts, ref_logprobs)):
        mask_C = torch.tensor(r.completion_mask, dtype=torch.bool)
        logp_C = torch.tensor(r.completion_logprobs, dtype=torch.float64)[mask_C]
        kl_N[i] = ESTIMATORS[estimator](logp_C, logq_C.to(torch.float64)[mask_C]).sum()
        if not math.isfinite(kl_N[i]):
            raise ValueError(
                f"data.kl_in_reward: environment {r.env_id!r} example {r.example_id}: the KL to the "
                f"reference is {float(kl_N[i])} (estimator {estimator}); try estimator k1, or check "
                "the engine's logprobs"
            )
    return kl_N


def shaped_groups(groups: list[list[Rollout]], kl_N: torch.Tensor, coef: float) -> list[list[Rollout]]:
    """Copies of the groups with reward - coef * KL_seq (kl_N in the groups' flattened order); the
    rollouts themselves keep the environment's reward."""
    shaped, i = [], 0
    for group in groups:
        shaped.append([replace(r, reward=r.reward - coef * float(kl_N[i + j])) for j, r in enumerate(group)])
        i += len(group)
    return shaped


class ReferenceScorer:
    """Per-token logprobs of rollouts' completion tokens under a frozen reference model.

    `model_name` (alias, HF id or folder) is loaded on the first call, float32 on the CPU (a vision-language
    model as its image-text-to-text class, grpokit.common.models.load_causal_lm); tests pass `model`
    instead. Rollouts are packed end to end into rows of at most `row_tokens` tokens (one longer rollout
    gets a row of its own), rollouts with images apart from text ones: the row's block-diagonal mask is [T, T].
    """

    def __init__(
        self, model_name: str | None = None, model: torch.nn.Module | None = None, row_tokens: int = 2048
    ) -> None:
        if model_name is None and model is None:
            raise ValueError("data.kl_in_reward needs the reference model: the policy's model.model")
        self.model_name, self._model, self.row_tokens = model_name, model, row_tokens

    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:
            log.info("data.kl_in_reward: loading the reference model %r (float32, CPU)", self.model_name)
            self._model = load_causal_lm(self.model_name, dtype=torch.float32).eval().requires_grad_(False)
        return self._model

    @torch.no_grad()
    def completion_logprobs(self, rollouts: list[Rollout], temperature: float) -> list[torch.Tensor]:
        """Each rollout's [C] float32 reference logprobs of its completion tokens at `temperature`
        (0 where completion_mask is 0: the LM head does not run there), in the order of `rollouts`.
        Text rollouts and rollouts with images are packed on separate rows (module docstring)."""
        out: list[torch.Tensor | None] = [None] * len(rollouts)
        for images in (False, True):
            order = [i for i, r in enumerate(rollouts) if bool(r.vision) is images]
            scored = [logq for row in self._rows([rollouts[i] for i in order]) for logq in self._row(row, temperature)]
            for i, logq_C in zip(order, scored):
                out[i] = logq_C
        return out

    def _row(self, row: list[Rollout], temperature: float) -> list[torch.Tensor]:
        """The completion logprobs of one packed row's rollouts, as the trainer computes a micro-batch's
        (grpokit.trainer.policy: packed_token_logprobs with the row's image inputs, if any)."""
        ids, positions, needed, lens = [], [], [], []
        for r in row:
            ids += r.prompt_ids + r.completion_ids
            positions += range(r.num_tokens)
            needed += [0] * len(r.prompt_ids) + list(r.completion_mask)
            lens.append(r.num_tokens)
        vision = concat([r.vision for r in row]) if any(r.vision for r in row) else None
        logprobs_T = packed_token_logprobs(
            self.model,
            torch.tensor(ids),
            torch.tensor(positions),
            torch.tensor(lens),
            temperature,
            needed_T=torch.tensor(needed, dtype=torch.bool),
            share_prefixes=vision is None,  # a text row's G copies of each prompt run once (grpokit.common.prefix_tree)
            vision=vision,
        )
        out, start = [], 0
        for r in row:
            out.append(logprobs_T[start + len(r.prompt_ids) : start + r.num_tokens])
            start += r.num_tokens
        return out

    def _rows(self, rollouts: list[Rollout]) -> list[list[Rollout]]:
        rows: list[list[Rollout]] = []
        tokens = 0
        for r in rollouts:
            if not rows or tokens + r.num_tokens > self.row_tokens:
                rows.append([])
                tokens = 0
            rows[-1].append(r)
            tokens += r.num_tokens
        return rows


class KLInReward:
    """The settings and the reference: shaped copies of a step's groups, for the advantages only."""

    def __init__(self, settings: KLInRewardSettings, scorer: ReferenceScorer) -> None:
        self.settings, self.scorer = settings, scorer

    def shape(self, groups: list[list[Rollout]], temperature: float) -> tuple[list[list[Rollout]], dict[str, float]]:
        """(the groups with reward - coef * KL_seq, the metrics kl_in_reward/kl_mean,
        kl_in_reward/reward_shaped_mean and kl_in_reward/ref_time over the groups' rollouts)."""
        rollouts = [r for g in groups for r in g]
        if not rollouts:
            return groups, {}
        start = time.perf_counter()
        kl_N = sequence_kl(rollouts, self.scorer.completion_logprobs(rollouts, temperature), self.settings.estimator)
        shaped = shaped_groups(groups, kl_N, self.settings.coef)
        metrics = {
            "kl_in_reward/kl_mean": float(kl_N.mean()),
            "kl_in_reward/reward_shaped_mean": sum(r.reward for g in shaped for r in g) / len(rollouts),
            "kl_in_reward/ref_time": time.perf_counter() - start,
        }
        return shaped, metrics


def warn_if_loss_has_kl(settings: KLInRewardSettings | None, loss) -> None:
    """A KL term in the loss (a loss with needs_reference, e.g. ClippedPG beta > 0) and data.kl_in_reward
    both pull toward the initial policy: allowed (verl prints a notice too), but the pull is counted twice."""
    if settings is not None and settings.coef > 0 and getattr(loss, "needs_reference", False):
        log.warning(
            "data.kl_in_reward (coef %g) and model.loss %s's own KL term both penalise divergence from the "
            "initial policy: the penalty counts twice (allowed, as in verl); set one of them to 0 to keep one",
            settings.coef,
            type(loss).__name__,
        )
