"""Filesystem transport: one safetensors file per step under `{run_dir}/rollouts/`.

The writer renames a complete temp file into place (atomic on POSIX), so the reader sees a batch
whole or not at all. Works across processes and hosts that share the directory.
"""

from __future__ import annotations

import time
from pathlib import Path

from grpokit.io import atomic_write_bytes
from grpokit.transport import Transport
from grpokit.transport.codec import decode_batch, encode_batch
from grpokit.types import TrainingBatch


class FilesystemTransport(Transport):
    """Batches as files `rollouts/step_N.safetensors`, written atomically."""

    def __init__(self, poll_interval: float = 0.05, keep_last: int = 4) -> None:
        """
        Args:
            poll_interval: seconds between checks for the next batch file.
            keep_last: batch files kept on disk; older ones are deleted once read (0 keeps all).
        """
        self.poll_interval = poll_interval
        self.keep_last = keep_last

    def path(self, step: int) -> Path:
        return self.run_dir / "rollouts" / f"step_{step}.safetensors"

    def has(self, step: int) -> bool:
        return self.path(step).exists()

    def send(self, batch: TrainingBatch) -> None:
        atomic_write_bytes(self.path(batch.step), encode_batch(batch))

    def receive(self, step: int, timeout: float) -> TrainingBatch:
        path, deadline = self.path(step), time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no batch for step {step} at {path} after {timeout:.0f}s: is the orchestrator running?")
            time.sleep(self.poll_interval)
        batch = decode_batch(path.read_bytes())
        if self.keep_last:
            self.path(step - self.keep_last).unlink(missing_ok=True)
        return batch
