"""The `loss` kind: turns the trainer's logprobs and a micro-batch into a scalar to minimise.

Subclass `Loss`, implement `__call__`, and name the class in a recipe (`model.loss`). One inputs
dataclass carries everything a loss may use, so adding a field never breaks existing losses.
"""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from grpokit.types import TrainingBatch


@dataclass
class LossInputs:
    """Per-token tensors of one packed micro-batch (T tokens, N sequences).

    Attributes:
        trainer_logprobs_T: the policy's logprob of each token, with gradient; 0 outside loss_mask_T and
            expert_mask_T (the trainer runs the LM head only on those tokens; so do ref_logprobs_T,
            entropy_T and teacher_logprobs_T).
        inference_logprobs_T: the engine's logprob of each token (no gradient).
        advantages_T: each token's advantage (its sequence's, unless the advantage assigns credit per token).
        loss_mask_T: 1.0 where the loss applies (completion tokens the policy wrote).
        seq_ids_T: index of the sequence each token belongs to (0..N-1).
        num_seqs: N.
        loss_normalizer: the number of loss tokens in the whole optimizer step (all micro-batches),
            so gradient accumulation over micro-batches gives the same gradient as one big batch.
        step_num_seqs: sequences with at least one loss token in the whole optimizer step (the
            denominator of per-sequence-mean normalisations such as GRPO's).
        is_truncated_N: True for sequences cut at max_tokens without EOS (None if unknown).
        ref_logprobs_T: a frozen reference policy's logprobs (no gradient); set only when the loss
            declares `needs_reference = True`.
        entropy_T: the policy's predictive entropy at each token, with gradient; set only when the
            loss declares `needs_entropy = True` (it costs one more [tokens, vocab] tensor).
        teacher_logprobs_T: a frozen teacher model's logprobs of the same tokens (no gradient), at the
            sampling temperature; set when the recipe names `model.teacher_model`, else None.
        expert_mask_T: 1.0 on the completion tokens of expert (gold) sequences, which the orchestrator
            adds with `data.expert`; loss_mask_T never covers them (they have no reward or advantage).
            The trainer always sets it (zeros without experts); None only in hand-built inputs.
        expert_normalizer: the expert tokens of the whole optimizer step (at least 1): the denominator
            of a token-mean SFT term, as loss_normalizer is of the RL terms.
        num_micro_batches: micro-batches in the optimizer step (for per-micro-batch normalisations).
        step: the trainer step (0-based), for losses with schedules.
        max_steps: the run's number of steps.
    """

    trainer_logprobs_T: torch.Tensor
    inference_logprobs_T: torch.Tensor
    advantages_T: torch.Tensor
    loss_mask_T: torch.Tensor
    seq_ids_T: torch.Tensor
    num_seqs: int
    loss_normalizer: float
    step_num_seqs: int = 1
    is_truncated_N: torch.Tensor | None = None
    ref_logprobs_T: torch.Tensor | None = None
    entropy_T: torch.Tensor | None = None
    teacher_logprobs_T: torch.Tensor | None = None
    expert_mask_T: torch.Tensor | None = None
    expert_normalizer: float = 1.0
    num_micro_batches: int = 1
    step: int = 0
    max_steps: int = 1


class Loss(ABC):
    """Contract: `loss(inputs) -> (loss, metrics)`.

    `loss` is a 0-dim tensor, this micro-batch's share of the step's loss: the trainer sums the
    micro-batches' losses with no further averaging, so normalise by `inputs.loss_normalizer` (or a
    constant). `metrics` maps names to 0-dim detached tensors holding means over this micro-batch's
    loss tokens; the trainer averages them over micro-batches weighted by loss tokens.

    A loss that sets the class attribute `needs_reference = True` gets `inputs.ref_logprobs_T` from a
    frozen copy of the initial policy (with LoRA: the base model, adapter disabled). One that sets
    `needs_teacher = True` needs `model.teacher_model` (the Policy refuses the recipe without it, and a
    teacher without such a loss). One that sets `needs_experts = True` trains on the expert sequences
    `data.expert` adds (`inputs.expert_mask_T`); the trainer refuses a batch with expert sequences for
    any other loss (it would ignore them), and a batch without them for such a loss.
    """

    needs_reference: bool = False
    needs_entropy: bool = False
    needs_teacher: bool = False
    needs_experts: bool = False

    @abstractmethod
    def __call__(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Return this micro-batch's loss and its metrics."""


def segment_sum(values_T: torch.Tensor, seq_ids_T: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """Sum per-token values into per-sequence totals (shape N)."""
    out_N = torch.zeros(num_seqs, dtype=values_T.dtype, device=values_T.device)
    return out_N.index_add(0, seq_ids_T, values_T)


def check_experts(loss: Loss, batch: TrainingBatch) -> None:
    """Refuse a batch whose expert sequences (data.expert) the loss would ignore, or a loss that needs
    them and a batch of sampled sequences without any."""
    name = type(loss).__name__
    if batch.num_expert_tokens and not loss.needs_experts:
        raise ValueError(
            "the batch has expert completions (data.expert) but model.loss "
            f"{name} does not train on them: use Chord, or remove data.expert"
        )
    if loss.needs_experts and batch.num_loss_tokens and not batch.num_expert_tokens:
        raise ValueError(
            f"model.loss {name} trains on expert completions, and the "
            "batch has none: set data.expert (e.g. {field: answer})"
        )


def checked_output(loss: Loss, out) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`out` of `loss(inputs)` as (0-dim loss, metrics), refused (naming the loss and the contract) unless
    the loss is a one-element tensor and the metrics a dict of one-element tensors or numbers: a per-token
    loss used to fail in backward ("grad can be implicitly created only for scalar outputs") and a missing
    metrics dict in the trainer's averaging, naming neither. A (1,)-shaped loss is taken as 0-dim."""
    name = type(loss).__name__
    contract = "a Loss returns (loss, metrics): a 0-dim tensor and a dict of 0-dim tensors"
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(f"model.loss {name} returned {type(out).__name__}; {contract}")
    value, metrics = out
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        got = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise TypeError(f"model.loss {name} returned {got} as its loss; {contract}")
    if not isinstance(metrics, dict):
        raise TypeError(f"model.loss {name} returned {type(metrics).__name__} as its metrics; {contract}")
    for key, v in metrics.items():
        if not (isinstance(v, numbers.Real) or (isinstance(v, torch.Tensor) and v.numel() == 1)):
            got = f"shape {tuple(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__
            raise TypeError(f"model.loss {name}: metric {key!r} is {got}; {contract}")
    return value.reshape(()), metrics
