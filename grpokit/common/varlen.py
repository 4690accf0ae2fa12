"""Packed-sequence ("varlen") attention for the trainer, registered as a transformers attention backend.

Packing puts several sequences in one row. The dense alternative (grpokit.common.logprobs.packed_attention_mask)
builds a [T, T] block-diagonal mask, which costs T^2 memory and sends SDPA to a kernel that reads the
whole mask. Here attention runs per sequence from cumulative lengths (cu_seqlens), the layout flash
attention's varlen kernels take: on CUDA `torch.nn.attention.varlen.varlen_attn` (FlashAttention in
torch, no extra package), on CPU, and on CUDA in float32 (which FlashAttention refuses), a loop of causal
SDPA calls per sequence (exact, for tests and small runs). transformers passes `cu_seq_lens_q/k` and
`max_length_q/k` keyword arguments through its decoder layers to the attention function; no mask is built
for a custom backend.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from grpokit.common.models import unwrap_peft

NAME = "grpokit_varlen"
FLASH_DTYPES = (torch.float16, torch.bfloat16)  # what the CUDA varlen (flash) kernel takes


def varlen_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention interface: query [1, H, T, D], key/value [1, Hkv, T, D] -> ([1, T, H, D], None)."""
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None:
        raise ValueError(
            f"attention backend {NAME!r} needs cu_seq_lens_q (packed "
            "sequence boundaries); call it through grpokit.common.logprobs"
        )
    max_len = int(kwargs.get("max_length_q"))
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)  # [T, H, D]
    gqa = q.shape[1] != k.shape[1]
    if q.is_cuda and q.dtype in FLASH_DTYPES:
        out = _cuda_varlen(q, k, v, cu_seqlens, max_len, scaling, gqa)
    else:
        out = torch.empty_like(q)
        bounds = cu_seqlens.tolist()
        for start, end in zip(bounds[:-1], bounds[1:]):
            o = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1),
                k[start:end].transpose(0, 1),
                v[start:end].transpose(0, 1),
                is_causal=True,
                scale=scaling,
                enable_gqa=gqa,
            )
            out[start:end] = o.transpose(0, 1)
    return out[None], None


def _cuda_varlen(q, k, v, cu_seqlens, max_len, scaling, gqa):
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    kwargs = {"scale": scaling}
    kwargs.update({"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True})
    if gqa and "enable_gqa" in params:
        kwargs["enable_gqa"] = True
    elif gqa:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    cu = cu_seqlens.to(torch.int32)
    return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kwargs)


def register() -> str:
    """Register the backend with transformers (idempotent); return its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, varlen_attention_forward)
    return NAME


def use_varlen(model: torch.nn.Module) -> None:
    """Switch `model` (and a peft wrapper's base) to the varlen backend."""
    register()

    target = unwrap_peft(model)
    if hasattr(target, "set_attn_implementation"):
        target.set_attn_implementation(NAME)
    else:
        target.config._attn_implementation = NAME
