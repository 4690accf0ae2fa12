"""Lightning callbacks that tie the trainer to the rest of the loop."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import lightning as L

from grpokit.broadcast import WeightBroadcast
from grpokit.common.checksums import tensors_sha256

log = logging.getLogger(__name__)


class WeightSync(L.Callback):
    """Publishes the policy's weights when training starts (or resumes) and after every optimizer step.

    Step numbering: the weights published as step n have seen n optimizer steps, and the trainer's
    step n trains on the batch for step n. Publishing at on_train_start works because Policy takes
    the dataloader iterator, so Lightning fetches no batch before it (the first batch needs them).
    With several trainer ranks only global rank 0 publishes; under FSDP2 every rank first joins the
    gather of the full weights (Policy.weight_update).

    A run that ends at max_steps always leaves the final step's weights published: a process killed
    after writing its last checkpoint but before publishing resumes at max_steps, where Lightning runs
    no training hooks at all, so teardown publishes them.
    """

    def __init__(self, broadcast: WeightBroadcast) -> None:
        self.broadcast = broadcast
        self.published_step = -1

    def _publish(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Publish the current weights from rank 0 (DDP ranks hold identical weights; rank 0 speaks for
        them). Sharded weights are gathered first, which every rank joins."""
        if trainer.is_global_zero or getattr(pl_module, "sharded", False):
            update = pl_module.weight_update(trainer.global_step)
            if trainer.is_global_zero:
                self.broadcast.publish(update)
        self.published_step = trainer.global_step

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._publish(trainer, pl_module)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        try:
            ended = stage == "fit" and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps
            if ended and self.published_step < trainer.global_step:
                self._publish(trainer, pl_module)
        finally:
            self.broadcast.close()  # frees sockets, process groups or shared-memory segments

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        start = time.perf_counter()
        self._publish(trainer, pl_module)
        pl_module.last_weight_sync_time = time.perf_counter() - start  # logged with the next step's row


class ShareBaseWeights(L.Callback):
    """Co-locate `fit` with LoRA: the engine samples with the trainer's frozen base weights instead of a
    copy of its own (BuiltinEngine.share_base_weights), once the trainer's model is on its device and
    before the first weights are published (so before WeightSync's on_train_start)."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        shared = self.engine.share_base_weights(pl_module.lm)
        log.info("engine shares %.1f MiB of base weights with the trainer", shared / 2**20)


class RankChecksums(L.Callback):
    """Writes the sha256 of each rank's publishable weights after every step, one file per rank:
    `{run_dir}/rank_checksums/rank_{R}.jsonl` with {"step", "rank", "sha256"} lines.

    A check that DDP ranks stay identical (they must: every rank applies the same all-reduced gradient),
    and that what rank 0 publishes is what every rank trains. Under FSDP2 each rank holds a shard, so
    only rank 0 writes (the gathered weights it publishes). Add it with
    `--trainer.callbacks+=grpokit.trainer.callbacks.RankChecksums`; it costs one copy of the trainable weights
    per step.
    """

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        step = trainer.global_step
        tensors = pl_module.weight_update(step).tensors
        if getattr(pl_module, "sharded", False) and not trainer.is_global_zero:
            return
        line = json.dumps({"step": step, "rank": trainer.global_rank, "sha256": tensors_sha256(tensors)})
        folder = Path(trainer.default_root_dir) / "rank_checksums"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"rank_{trainer.global_rank}.jsonl", "a") as f:
            f.write(line + "\n")
