"""Token sampling on the device without a sort or torch.multinomial: the Gumbel-max trick.

argmax_v (l_v / T + G_v) with G_v = -log(E_v), E_v ~ Exp(1) i.i.d., is a draw from softmax(l / T)
(Gumbel 1954; e.g. Maddison et al. 2014). It costs a few elementwise passes over [B, V] instead of
multinomial's cumulative-sum search, which dominates a decode step at batch 256 with a 152k vocabulary.
The logprob returned is log softmax(l / T)[token] = l_token / T - logsumexp(l / T), the same quantity
the plain sampler and the trainer compute. Top-p < 1 needs the sorted distribution and goes through
the plain sampler's `sample_next`.
"""

from __future__ import annotations

import torch

from grpokit.inference.sampler import sample_next


def sample_tokens(
    logits_BV: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator, pick=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its logprob under softmax(logits / temperature): (token_B, logprob_B).

    `pick`: a compiled grpokit.inference.fast.kernels.gumbel_pick (fuses the passes over [B, V]).
    """
    if temperature == 0 or top_p < 1.0:
        return sample_next(logits_BV, temperature, top_p, generator)
    if pick is not None:
        noise_BV = torch.empty(logits_BV.shape, dtype=torch.float32, device=logits_BV.device).exponential_(
            generator=generator
        )
        return pick(logits_BV, noise_BV, temperature)
    scaled_BV = logits_BV.float()
    if scaled_BV.data_ptr() == logits_BV.data_ptr():
        scaled_BV = scaled_BV.clone()  # float32 input: never scale the caller's tensor in place
    scaled_BV.div_(temperature)
    lse_B = torch.logsumexp(scaled_BV, dim=-1)
    gumbel_BV = torch.empty_like(scaled_BV).exponential_(generator=generator).log_().neg_()
    token_B = gumbel_BV.add_(scaled_BV).argmax(dim=-1)
    return token_B, scaled_BV.gather(-1, token_B[:, None]).squeeze(-1) - lse_B
