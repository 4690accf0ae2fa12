"""Supervised fine-tuning's objective: the masked token-mean negative log-likelihood (`grpokit sft`).

    L = -sum_{t in A} logp_train_t / |A_step|

with A the loss tokens of this micro-batch (`inputs.loss_mask_T`: the assistant tokens of a chat, never
system, user or tool tokens; grpokit/sft/render.py) and |A_step| the loss tokens of the whole optimizer
step (`inputs.loss_normalizer`), so gradient accumulation over micro-batches, packing and ranks gives the
gradient of one batch: every assistant token of the step weighs the same (TRL's and torchtune's token
mean, not a mean of per-sequence means). Advantages and the engine's logprobs are not read: nothing was
sampled. d L / d logp_t = -1 / |A_step| on loss tokens, 0 elsewhere.
"""

from __future__ import annotations

import torch

from grpokit.loss import Loss, LossInputs


class NLL(Loss):
    """Token-mean negative log-likelihood over the loss tokens of the step (SFT; `grpokit sft`'s loss)."""

    def __call__(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask_T = inputs.loss_mask_T.to(inputs.trainer_logprobs_T.dtype)
        nll_T = -inputs.trainer_logprobs_T * mask_T  # 0 off the loss tokens (their logprobs are 0 anyway)
        loss = nll_T.sum() / inputs.loss_normalizer
        n = mask_T.sum().clamp(min=1)
        return loss, {"nll": (nll_T.detach().sum() / n)}
