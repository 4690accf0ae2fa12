"""Checksums of tensors, to show that two processes hold bit-identical weights (DDP ranks, an engine
and the trainer). Needs only torch: vLLM's worker process imports it too (grpokit.inference.vllm.worker)."""

from __future__ import annotations

import hashlib

import torch


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over (name, dtype, shape, raw bytes) of each tensor, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
