"""Per-token log-probabilities of packed sequences.

Packing puts several sequences in one row; position_ids restart at 0 for each, and a block-diagonal
causal mask keeps a token from attending to the sequence packed before it (transformers' sdpa and
eager paths do not infer that from position_ids alone: measured, the logits differ otherwise).
"""

from __future__ import annotations

import torch


def packed_attention_mask(seq_lens_N: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive [1, 1, T, T] mask: 0 where token q may attend to token k (same sequence, k <= q)."""
    seq_ids_T = torch.repeat_interleave(torch.arange(len(seq_lens_N), device=seq_lens_N.device), seq_lens_N)
    t = seq_ids_T.numel()
    allowed = torch.ones(t, t, dtype=torch.bool, device=seq_lens_N.device).tril_() & (seq_ids_T[:, None] == seq_ids_T[None, :])
    mask = torch.zeros(t, t, dtype=dtype, device=seq_lens_N.device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def selective_logprobs(logits_TV: torch.Tensor, targets_T: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] per row, in float32, without materialising the full log-softmax."""
    logits_TV = logits_TV.float()
    picked_T = logits_TV.gather(-1, targets_T[:, None]).squeeze(-1)
    return picked_T - torch.logsumexp(logits_TV, dim=-1)


def packed_token_logprobs(
    model: torch.nn.Module,
    input_ids_T: torch.Tensor,
    position_ids_T: torch.Tensor,
    seq_lens_N: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
):
    """logprob of input_ids[t] given the tokens before it in its own sequence (0 at a sequence's first token).

    Logits are divided by `temperature` so the result matches the engine's sampling distribution. With
    `with_entropy`, also returns the entropy of each token's predictive distribution (same alignment;
    0 at sequence starts): H = logsumexp(l) - sum softmax(l) * l, which materialises one more
    [tokens, vocab] float32 tensor (kept for backward) per micro-batch.
    """
    dtype = next(model.parameters()).dtype
    mask = packed_attention_mask(seq_lens_N.to(input_ids_T.device), dtype if dtype.is_floating_point else torch.float32)
    logits_TV = model(input_ids=input_ids_T[None], position_ids=position_ids_T[None], attention_mask=mask).logits[0]
    logprobs_T = torch.zeros(input_ids_T.shape, dtype=torch.float32, device=input_ids_T.device)
    # token t is predicted by the logits at t-1; at a sequence start (position 0) there is no prediction.
    scaled_TV = logits_TV[:-1] / temperature
    predicted = selective_logprobs(scaled_TV, input_ids_T[1:])
    starts_T = position_ids_T[1:] == 0
    logprobs_T = torch.cat([logprobs_T[:1], torch.where(starts_T, torch.zeros_like(predicted), predicted)])
    if not with_entropy:
        return logprobs_T
    scaled_TV = scaled_TV.float()
    entropy = torch.logsumexp(scaled_TV, -1) - (torch.softmax(scaled_TV, -1) * scaled_TV).sum(-1)
    return logprobs_T, torch.cat([entropy.new_zeros(1), torch.where(starts_T, torch.zeros_like(entropy), entropy)])
