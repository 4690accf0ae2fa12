"""Lightning callbacks that tie the trainer to the rest of the loop."""

from __future__ import annotations

import time

import lightning as L

from grpokit.broadcast import WeightBroadcast


class WeightSync(L.Callback):
    """Publishes the policy's weights when training starts (or resumes) and after every optimizer step.

    Step numbering: the weights published as step n have seen n optimizer steps, and the trainer's
    step n trains on the batch for step n. Publishing at on_train_start works because Policy takes
    the dataloader iterator, so Lightning fetches no batch before it (the first batch needs them).
    """

    def __init__(self, broadcast: WeightBroadcast) -> None:
        self.broadcast = broadcast

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.broadcast.publish(pl_module.weight_update(trainer.global_step))

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.broadcast.close()  # frees sockets, process groups or shared-memory segments

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        start = time.perf_counter()
        self.broadcast.publish(pl_module.weight_update(trainer.global_step))
        pl_module.last_weight_sync_time = time.perf_counter() - start  # logged with the next step's row
