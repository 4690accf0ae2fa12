"""Wall-clock timing and peak memory around a callable, device-aware."""

from __future__ import annotations

import resource
import time

import torch


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float:
    """Peak allocated GPU memory since reset_peak (CUDA), or the process's max RSS (CPU; never resets)."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def timed(fn, device: str, repeats: int = 1) -> tuple[float, object]:
    """Mean seconds per call of fn() over `repeats` calls (synchronised), and the last result."""
    sync(device)
    t = time.perf_counter()
    for _ in range(repeats):
        result = fn()
    sync(device)
    return (time.perf_counter() - t) / repeats, result
