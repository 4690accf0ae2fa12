"""The `broadcast` kind: carries the trainer's weights to the inference engine after each step.

One class holds both ends: `publish` on the trainer, `poll` on the engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from grpokit.types import WeightUpdate


class WeightBroadcast(ABC):
    """Contract: `publish(update)` makes step `update.step` visible whole; `poll(after_step)` returns the
        newest complete update with a step greater than `after_step`, or None. `poll` never blocks and
        never returns a partially written update. `setup(run_dir)` is called once per process first.
    `poll(after_step, upto=s)` returns the newest update in (after_step, s] instead: the orchestrator's
    deterministic schedule (data.deterministic) samples generation n with exactly the weights of step
    n - max_async_level, even when the trainer has published newer ones already.

    `keeps_steps`: `poll(..., upto=...)` can return a step older than the newest (FilesystemBroadcast and
    IPCBroadcast keep their last steps, NCCLBroadcast's receiver keeps what it received and was not yet
    loaded); False where only the newest exists (VLLMNCCLBroadcast applies each step inside vLLM as it
    arrives), which the deterministic schedule refuses at start when max_async_level >= 1.

        `applies_norm_weights`: the broadcast itself puts `update.norm_tensors` (QeRL's noisy RMSNorm weights)
        into the engine's model (VLLMNCCLBroadcast, into vLLM's worker), so the engine need not load them.

        `observable`: any process may poll, any number of them, without taking anything from the engine
        (FilesystemBroadcast: step folders anyone can read; VLLMNCCLBroadcast: an HTTP call into vLLM's
        worker, the real receiver). False where polling *is* receiving, so only the engine's own process may
        poll (NCCLBroadcast: the poller joins the trainer's two-rank group as the engine; IPCBroadcast: it
        maps the trainer's segments or CUDA buffers). The orchestrator of a RemoteEngine then learns the
        trainer's progress from the servers (grpokit.orchestrator.weights).

        `max_engines`: how many engine processes can receive it (None: any number; NCCLBroadcast: 1).
    """

    run_dir: Path
    applies_norm_weights: bool = False
    observable: bool = True
    max_engines: int | None = None
    keeps_steps: bool = True

    def setup(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)

    @abstractmethod
    def publish(self, update: WeightUpdate) -> None:
        """Make the update visible to pollers; returns once it is complete."""

    @abstractmethod
    def poll(self, after_step: int, upto: int | None = None) -> WeightUpdate | None:
        """Return the newest complete update with after_step < step <= upto (None: no upper bound), or None."""

    def discard_after(self, step: int) -> None:
        """Forget published steps after `step`: a trainer (re)starting at step + 1, from its checkpoint or
        fresh, publishes those steps again, so what is there belongs to a killed or earlier run. The
        trainer's process calls it before it starts publishing (and, in `fit`, before its rollout thread
        starts); a no-op for broadcasts that keep nothing."""

    def close(self) -> None:
        """Release process groups or handles."""
