"""The `transport` kind: carries TrainingBatches from the orchestrator to the trainer.

One class holds both ends (`send` and `receive`), so a recipe cannot pair a filesystem sender with a
ZMQ receiver. Payloads are tensors serialised without pickle (see codec.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from grpokit.common.collectives import broadcast_bytes
from grpokit.common.errors import RunDataError
from grpokit.transport.codec import decode_batch, encode_batch
from grpokit.types import TrainingBatch


class Transport(ABC):
    """Contract: `send(batch)` on the orchestrator side, `receive(step, timeout)` on the trainer side.

    `receive` blocks until the batch for `step` is there and returns it whole, or raises TimeoutError;
    the trainer refuses a batch whose own `step` is another (naming `source(step)`).
    `setup(run_dir)` is called once per process before either end is used.
    """

    run_dir: Path

    def setup(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)

    @abstractmethod
    def send(self, batch: TrainingBatch) -> None:
        """Hand the batch over; returns once it is visible to the receiver."""

    @abstractmethod
    def receive(self, step: int, timeout: float) -> TrainingBatch:
        """Return the batch for `step`, waiting up to `timeout` seconds."""

    def source(self, step: int) -> str:
        """Where the batch of `step` is read from, for error messages (a file, an address)."""
        return f"data.transport {type(self).__name__}"

    def has(self, step: int) -> bool:
        """Whether the batch of `step` was sent and is still held for the receiver (False if unknown)."""
        return False

    def retain_from(self, step: int) -> None:
        """The trainer's newest checkpoint is of `step`: a trainer resumed from it asks again for the
        batches of `step` and later, so a transport that frees read batches keeps those (no-op here)."""

    def close(self) -> None:
        """Release sockets or handles."""


def checked_step(batch: TrainingBatch, step: int, transport: Transport) -> TrainingBatch:
    """`batch`, if it is the batch of `step`; training another step's batch in its place would lose
    `step` and train the other twice, with nothing in the metrics to show it."""
    if batch.step != step:
        raise RunDataError(
            f"{transport.source(step)} holds the batch of step {batch.step}, not of step {step}, which the trainer "
            "asked for: a batch file was copied or renamed, or two orchestrators send to this run; remove it and "
            f"resume the run so that the orchestrator samples step {step} again"
        )
    return batch


def share_batch(batch: TrainingBatch | None) -> TrainingBatch:
    """Rank 0's batch on every trainer rank: rank 0 passes the batch it received, the others None. It
    travels as the bytes a transport carries (codec.py), so only rank 0 reads the transport
    (grpokit.trainer.distributed says why)."""
    raw = broadcast_bytes(encode_batch(batch) if batch is not None else None)
    return batch if batch is not None else decode_batch(raw)
