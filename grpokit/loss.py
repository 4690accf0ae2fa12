"""The `loss` kind: turns the trainer's logprobs and a micro-batch into a scalar to minimise.

Subclass `Loss`, implement `__call__`, and name the class in a recipe (`model.loss`). One inputs
dataclass carries everything a loss may use, so adding a field never breaks existing losses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class LossInputs:
    """Per-token tensors of one packed micro-batch (T tokens, N sequences).

    Attributes:
        trainer_logprobs_T: the policy's logprob of each token, with gradient.
        inference_logprobs_T: the engine's logprob of each token (no gradient).
        advantages_T: each token's advantage (its sequence's advantage).
        loss_mask_T: 1.0 where the loss applies (completion tokens the policy wrote).
        seq_ids_T: index of the sequence each token belongs to (0..N-1).
        num_seqs: N.
        loss_normalizer: the number of loss tokens in the whole optimizer step (all micro-batches),
            so gradient accumulation over micro-batches gives the same gradient as one big batch.
    """

    trainer_logprobs_T: torch.Tensor
    inference_logprobs_T: torch.Tensor
    advantages_T: torch.Tensor
    loss_mask_T: torch.Tensor
    seq_ids_T: torch.Tensor
    num_seqs: int
    loss_normalizer: float


class Loss(ABC):
    """Contract: `loss(inputs) -> (loss, metrics)`.

    `loss` is a 0-dim tensor, this micro-batch's share of the step's loss: the trainer sums the
    micro-batches' losses with no further averaging, so normalise by `inputs.loss_normalizer` (or a
    constant). `metrics` maps names to 0-dim detached tensors holding means over this micro-batch's
    loss tokens; the trainer averages them over micro-batches weighted by loss tokens.
    """

    @abstractmethod
    def __call__(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Return this micro-batch's loss and its metrics."""


def segment_sum(values_T: torch.Tensor, seq_ids_T: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """Sum per-token values into per-sequence totals (shape N)."""
    out_N = torch.zeros(num_seqs, dtype=values_T.dtype, device=values_T.device)
    return out_N.index_add(0, seq_ids_T, values_T)
