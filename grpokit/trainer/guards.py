"""Numerics guard: a non-finite loss or gradient norm skips the optimizer step instead of poisoning the
weights; several in a row stop the run with the offending batch saved for inspection."""

from __future__ import annotations

import logging
import math
from pathlib import Path

from grpokit.common.io import atomic_write_bytes
from grpokit.transport.codec import encode_batch
from grpokit.types import TrainingBatch

log = logging.getLogger(__name__)


class NonFiniteError(RuntimeError):
    """Too many consecutive optimizer steps had a non-finite loss or gradient norm."""


class NonFiniteGuard:
    """Counts skipped steps; raises NonFiniteError after `max_consecutive` in a row (0: never)."""

    def __init__(self, max_consecutive: int) -> None:
        self.max_consecutive = max_consecutive
        self.skipped = 0
        self.consecutive = 0

    def allows_step(self, loss: float, grad_norm: float, batch: TrainingBatch, run_dir: str | Path | None) -> bool:
        """True if the optimizer may step; otherwise counts the skip, and saves the batch and raises
        when it is the max_consecutive-th in a row."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.consecutive = 0
            return True
        self.skipped += 1
        self.consecutive += 1
        log.warning(
            "step %d: non-finite loss %s or grad norm %s: optimizer step skipped (%d in a row)",
            batch.step,
            loss,
            grad_norm,
            self.consecutive,
        )
        if self.max_consecutive and self.consecutive >= self.max_consecutive:
            where = "not saved (no run folder)"
            if run_dir:
                path = Path(run_dir) / "bad_batches" / f"step_{batch.step}.safetensors"
                atomic_write_bytes(path, encode_batch(batch))
                where = f"saved to {path}"
            raise NonFiniteError(
                f"{self.consecutive} consecutive steps with a non-finite loss or gradient norm (last: "
                f"step {batch.step}, loss {loss}, grad norm {grad_norm}); the batch is {where}. Lower "
                "model.lr, check the loss's masks, or raise model.max_nonfinite_steps."
            )
        return False


class EmptyStepWatch:
    """Warns when a step trains on no token at all: every rollout was filtered or masked (e.g. each reply
    hit data.sampling.max_tokens with the Overlong filter enforced), so the weights cannot change and,
    sampled from the same weights, the next batches are likely masked too: a run that never recovers.
    Such steps are legal (the loss is an exact 0; the `loss_tokens` metric shows 0); the warning
    repeats at 10 in a row and every 50 after."""

    def __init__(self) -> None:
        self.in_a_row = 0

    def observe(self, step: int, num_loss_tokens: int, metrics: dict[str, float]) -> None:
        self.in_a_row = self.in_a_row + 1 if num_loss_tokens == 0 else 0
        if self.in_a_row in (1, 10) or (self.in_a_row and self.in_a_row % 50 == 0):
            masks = ", ".join(
                f"{k} {v:.2f}" for k, v in sorted(metrics.items()) if k.startswith("filter/") or k == "truncated_frac"
            )
            log.warning(
                "step %d trains on no token (%d such steps in a row): every rollout was filtered or masked "
                "(%s), so the weights do not change. If every reply is cut at data.sampling.max_tokens, "
                "raise it, or lower what drove replies there (an entropy bonus, the lr)",
                step,
                self.in_a_row,
                masks or "no filter metrics",
            )
