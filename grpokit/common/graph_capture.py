"""Keep CUDA graph captures and the trainer's steps apart in one process (co-locate mode).

The builtin engine's fast path captures a decode step's CUDA graph the first time it needs a (slot
bucket, length bucket), in the orchestrator's thread, while the trainer computes on the main thread. A
device-wide synchronize while any stream captures fails both the capture and the synchronizing call,
whatever the capture mode (CUDA programming guide, "Prohibited and Unhandled Operations"), and the
trainer makes such calls where grpokit does not control them: torch.compile's Inductor benchmarks a
kernel's launch configurations on first use with a device synchronize. A capture also puts the default
CUDA generator in capture mode, so a random op on another thread (dropout) fails meanwhile. So a capture
and a training step never overlap: both hold `capture_lock`; a capture waits for the step in progress
(once per new bucket, at most one step), and decode steps that replay captured graphs never wait.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_LOCK = threading.Lock()


@contextlib.contextmanager
def capture_lock(device: torch.device | str) -> Iterator[None]:
    """Hold the process's graph-capture lock on a CUDA device; nothing elsewhere (no graphs on a CPU)."""
    if torch.device(device).type != "cuda":
        yield
        return
    with _LOCK:
        yield
