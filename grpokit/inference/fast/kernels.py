"""The elementwise parts of a decoder layer as plain functions, so torch.compile can fuse them.

A replayed decode step at batch 256 is dominated not by its matrix products but by the number of small
kernels between them: Hugging Face's RMSNorm alone is seven (cast, square, mean, rsqrt, multiply, cast,
scale), rotary embeddings about ten per layer. Written as functions of tensors (weights passed in, so
one compiled function serves every layer), Inductor fuses each into one or two kernels; the matrix
products stay in the model's modules (so peft LoRA layers and in-place weight updates apply as
before). Without compilation the same functions run eagerly (CPU, tests) with Hugging Face's numerics.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama/Qwen RMSNorm as transformers computes it: normalise in float32, cast back, then scale."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def add_rms_norm(
    h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then the next norm: (h + delta, rms_norm(h + delta))."""
    h = h + delta
    return h, rms_norm(h, weight, eps)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def qk_norm_rope(q, k, cos, sin, q_norm_w, k_norm_w, eps: float):
    """Optional per-head q/k RMSNorm (Qwen3), then rotary embeddings (rotate-half convention)."""
    if q_norm_w is not None:
        q, k = rms_norm(q, q_norm_w, eps), rms_norm(k, k_norm_w, eps)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def decode_attention(q_BHD, keys_BKSD, values_BKSD, visible_BS, scaling: float) -> torch.Tensor:
    """One query per row against its cached keys [0, S), masked to the visible positions -> [B, H * D].

    Query heads are grouped under their key/value head (GQA) so keys are read once per kv head.
    """
    b, h, d = q_BHD.shape
    kv = keys_BKSD.shape[1]
    q = q_BHD.view(b, kv, h // kv, d)
    scores = torch.matmul(q, keys_BKSD.transpose(-1, -2)).float() * scaling  # [B, Hkv, G, S]
    scores = scores.masked_fill(~visible_BS[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(values_BKSD.dtype)
    return torch.matmul(probs, values_BKSD).reshape(b, h * d)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def gumbel_pick(
    logits_BV: torch.Tensor, exp_noise_BV: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gumbel-max draw from softmax(logits / T) given E ~ Exp(1) noise: (token_B, logprob_B).

    argmax(l / T - log E) is a sample of softmax(l / T); its logprob is l_tok / T - logsumexp(l / T).
    The noise is drawn outside (by the caller's torch.Generator, which compiled code cannot take).
    """
    scaled = logits_BV.float() / temperature
    lse = torch.logsumexp(scaled, dim=-1)
    token = (scaled - torch.log(exp_noise_BV)).argmax(dim=-1)
    return token, scaled.gather(-1, token[:, None]).squeeze(-1) - lse


class Kernels:
    """The functions above, compiled with Inductor (CUDA) or as they are."""

    def __init__(self, compile: bool) -> None:
        self.compiled = compile
        wrap = (lambda fn: torch.compile(fn, fullgraph=True)) if compile else (lambda fn: fn)
        if compile:
            import torch._dynamo.config as dynamo_config

            for name in ("cache_size_limit", "recompile_limit"):  # one entry per (bucket, shape)
                if hasattr(dynamo_config, name):
                    setattr(dynamo_config, name, max(getattr(dynamo_config, name), 64))
        self.rms_norm = wrap(rms_norm)
        self.add_rms_norm = wrap(add_rms_norm)
        self.qk_norm_rope = wrap(qk_norm_rope)
        self.decode_attention = wrap(decode_attention)
        self.silu_mul = wrap(silu_mul)
        self.gumbel_pick = wrap(gumbel_pick)
