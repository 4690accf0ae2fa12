"""Logits processors shared by grpokit's samplers: pure batched tensor functions, no host syncs.

Each takes the next-token logits of a batch and returns processed logits (a new tensor); every
argument that varies per row is a tensor on the logits' device, so a CUDA engine can call these inside
a captured graph. Order, as in HF `generate` and vLLM: min_tokens mask and repetition penalty on the raw
logits, then temperature, then top-p.

Shape legend: B rows in the batch, V vocabulary, T token positions, S stop token ids.
"""

from __future__ import annotations

import torch


def apply_min_tokens(
    logits_BV: torch.Tensor, num_generated_B: torch.Tensor, min_tokens: int | torch.Tensor, stop_ids_S: torch.Tensor
) -> torch.Tensor:
    """Forbid the stop tokens in rows that have generated fewer than `min_tokens` tokens.

    logits'[b, s] = -inf for s in stop_ids_S where num_generated_B[b] < min_tokens (vLLM's `min_tokens`,
    HF's `min_new_tokens`); all other logits unchanged.

    Args:
        logits_BV: next-token logits.
        num_generated_B: completion tokens each row has generated so far.
        min_tokens: one bound for all rows, or a bound per row (B).
        stop_ids_S: token ids that end a completion (EOS and stop token ids), int64.
    """
    early_B1 = (num_generated_B < min_tokens)[:, None]
    stops_BS = logits_BV.index_select(1, stop_ids_S).masked_fill(early_B1, float("-inf"))
    return logits_BV.index_copy(1, stop_ids_S, stops_BS)


def seen_tokens(token_ids_BT: torch.Tensor, valid_BT: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Mark, per row, every vocabulary id that occurs among its valid tokens: seen_BV (bool).

    Padding positions (valid_BT false) mark nothing, whatever id they hold.
    """
    counts_BV = torch.zeros(token_ids_BT.shape[0], vocab_size, dtype=torch.int32, device=token_ids_BT.device)
    return counts_BV.scatter_add_(1, token_ids_BT, valid_BT.to(torch.int32)) > 0


def mark_seen(seen_BV: torch.Tensor, token_B: torch.Tensor) -> torch.Tensor:
    """Add each row's newly sampled token to its seen set, in place; returns seen_BV."""
    return seen_BV.scatter_(1, token_B[:, None], True)


def apply_repetition_penalty(
    logits_BV: torch.Tensor, seen_BV: torch.Tensor, penalty: float | torch.Tensor
) -> torch.Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019), as HF and vLLM define it.

    For every token already in the row (prompt or completion, seen_BV true):
        logit' = logit / penalty  if logit > 0,   logit * penalty  otherwise;
    unseen tokens are unchanged. penalty > 1 discourages repeats, 1 is the identity. Departure from
    the paper: CTRL divides by the penalty regardless of sign, which rewards repeats with negative logits.

    Args:
        logits_BV: next-token logits.
        seen_BV: tokens present in each row's prompt or completion (see `seen_tokens`, `mark_seen`).
        penalty: one penalty for all rows, or one per row (B).
    """
    if isinstance(penalty, torch.Tensor):
        penalty = penalty.to(logits_BV.dtype)[:, None]
    penalized_BV = torch.where(logits_BV > 0, logits_BV / penalty, logits_BV * penalty)
    return torch.where(seen_BV, penalized_BV, logits_BV)
