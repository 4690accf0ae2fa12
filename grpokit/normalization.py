"""How a loss turns per-token terms into this micro-batch's share of the step's loss.

Shape legend: T tokens of one packed micro-batch, N sequences in it.

With l_t the per-token loss, M the micro-batch's loss tokens, |i| the loss tokens of sequence i:

    token     sum_{t in M} l_t / loss_normalizer                             (DAPO, Yu et al. 2025)
    sequence  sum_i (sum_{t in i} l_t / |i|) / step_num_seqs                 (GRPO, Shao et al. 2024)
    constant  sum_{t in M} l_t / (max_tokens_normalizer * step_num_seqs)     (Dr. GRPO, Liu et al. 2025)
    bnpo      (sum_{t in M} l_t / |M|) / num_micro_batches                   (TRL's `bnpo`)

loss_normalizer (loss tokens) and step_num_seqs (sequences with loss tokens) count the whole optimizer
step, so the first three, summed over micro-batches, give the step's loss whatever the split: a token
mean over the step, a mean over sequences of each sequence's token mean, and Dr. GRPO's
sum / (G * MAX_TOKENS) averaged over sequences. `bnpo` is a token mean within each micro-batch, averaged
over micro-batches: it depends on how the step is split (TRL's `bnpo` does the same per device batch).
Tokens outside loss_mask_T and sequences with no loss tokens contribute exactly 0 (no NaN, even where a
masked per-token value is not finite).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

import torch

from grpokit.loss import LossInputs, segment_sum

Normalization = Literal["token", "sequence", "constant", "bnpo"]


def check_normalization(normalization: str, max_tokens_normalizer: int | None) -> None:
    """Raise a ValueError naming the argument when a loss's normalization settings don't fit together."""
    modes = get_args(Normalization)
    if normalization not in modes:
        raise ValueError(f"normalization must be one of {', '.join(modes)}; got {normalization!r}")
    if normalization == "constant" and (max_tokens_normalizer is None or max_tokens_normalizer < 1):
        raise ValueError(
            f"normalization='constant' needs max_tokens_normalizer >= 1 (Dr. GRPO uses the generation budget, "
            f"max_tokens); got {max_tokens_normalizer!r}"
        )
    if normalization != "constant" and max_tokens_normalizer is not None:
        raise ValueError(
            f"max_tokens_normalizer is used only with normalization='constant'; got normalization={normalization!r}: "
            "set max_tokens_normalizer to null or normalization to 'constant'"
        )


def normalize(
    per_token_T: torch.Tensor, inputs: LossInputs, mode: Normalization, max_tokens_normalizer: int | None = None
) -> torch.Tensor:
    """Aggregate per-token losses into this micro-batch's 0-dim share of the step's loss (see the module)."""
    mask_T = inputs.loss_mask_T > 0
    masked_T = torch.where(mask_T, per_token_T, 0.0)
    return _MODES[mode](masked_T, mask_T, inputs, max_tokens_normalizer)


def token_mean(values_T: torch.Tensor, mask_T: torch.Tensor) -> torch.Tensor:
    """Detached mean of `values_T` over the tokens where `mask_T` is set (0 when there are none): a metric."""
    mask_T = mask_T > 0
    values_T = values_T.detach().float() if values_T.dtype == torch.bool else values_T.detach()
    return torch.where(mask_T, values_T, 0.0).sum() / mask_T.sum().clamp(min=1)


def _token(masked_T: torch.Tensor, mask_T: torch.Tensor, inputs: LossInputs, max_tokens: int | None) -> torch.Tensor:
    return masked_T.sum() / inputs.loss_normalizer


def _sequence(masked_T: torch.Tensor, mask_T: torch.Tensor, inputs: LossInputs, max_tokens: int | None) -> torch.Tensor:
    sums_N = segment_sum(masked_T, inputs.seq_ids_T, inputs.num_seqs)
    tokens_N = segment_sum(mask_T.to(masked_T.dtype), inputs.seq_ids_T, inputs.num_seqs)
    return (sums_N / tokens_N.clamp(min=1)).sum() / inputs.step_num_seqs


def _constant(masked_T: torch.Tensor, mask_T: torch.Tensor, inputs: LossInputs, max_tokens: int | None) -> torch.Tensor:
    if max_tokens is None:
        raise ValueError("normalization='constant' needs max_tokens_normalizer (the generation budget, max_tokens)")
    return masked_T.sum() / (max_tokens * inputs.step_num_seqs)


def _bnpo(masked_T: torch.Tensor, mask_T: torch.Tensor, inputs: LossInputs, max_tokens: int | None) -> torch.Tensor:
    return masked_T.sum() / mask_T.sum().clamp(min=1) / inputs.num_micro_batches


_MODES: dict[str, Callable[[torch.Tensor, torch.Tensor, LossInputs, int | None], torch.Tensor]] = {
    "token": _token,
    "sequence": _sequence,
    "constant": _constant,
    "bnpo": _bnpo,
}
