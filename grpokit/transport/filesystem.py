"""Filesystem transport: one safetensors file per step under `{run_dir}/rollouts/`.

The writer renames a complete temp file into place (atomic on POSIX), so the reader sees a batch
whole or not at all. Works across processes and hosts that share the directory.

Read batches are deleted once `keep_last` newer ones were read, but never those from the trainer's
newest checkpoint on (`retain_from`): a trainer killed and resumed from that checkpoint reads them
again, while the orchestrator, still running, has moved past them and will not sample them again.
"""

from __future__ import annotations

import time
from pathlib import Path

from grpokit.common.io import atomic_write_bytes
from grpokit.transport import Transport
from grpokit.transport.codec import decode_batch_file, encode_batch
from grpokit.types import TrainingBatch


class FilesystemTransport(Transport):
    """Batches as files `rollouts/step_N.safetensors`, written atomically."""

    def __init__(self, poll_interval: float = 0.05, keep_last: int = 4) -> None:
        """
        Args:
            poll_interval: seconds between checks for the next batch file.
            keep_last: read batch files kept on disk; older ones are deleted, except those from the
                newest checkpoint's step on (0 keeps all).
        """
        self.poll_interval = poll_interval
        self.keep_last = keep_last
        self.retained_from: int | None = None  # None: no checkpoint to resume from, nothing to keep
        self._pruned_below = 0

    def path(self, step: int) -> Path:
        return self.run_dir / "rollouts" / f"step_{step}.safetensors"

    def has(self, step: int) -> bool:
        return self.path(step).exists()

    def source(self, step: int) -> str:
        return f"data.transport FilesystemTransport file {self.path(step)}"

    def send(self, batch: TrainingBatch) -> None:
        atomic_write_bytes(self.path(batch.step), encode_batch(batch))

    def receive(self, step: int, timeout: float) -> TrainingBatch:
        path, deadline = self.path(step), time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no batch for step {step} at {path} after {timeout:.0f}s: is the orchestrator running?"
                )
            time.sleep(self.poll_interval)
        fix = f"delete it and resume the run: the orchestrator samples step {step} again"
        batch = decode_batch_file(path, path.read_bytes(), fix)
        if self.keep_last:
            self._prune(step - self.keep_last + 1)
        return batch

    def retain_from(self, step: int) -> None:
        self.retained_from = step

    def _prune(self, below: int) -> None:
        """Delete the batch files of steps before `below`, and before the retained step."""
        if self.retained_from is not None:
            below = min(below, self.retained_from)
        for step in range(self._pruned_below, below):
            self.path(step).unlink(missing_ok=True)
        self._pruned_below = max(self._pruned_below, below)
