"""Progress bars that count GRPO (or SFT) steps.

A GRPO run is one endless epoch bounded by `trainer.max_steps` (the orchestrator's stream of batches
has no length), so Lightning's default bar read "Epoch 0/-2" and counted batches of the current
epoch. These subclasses show "GRPO step 12/50": the trainer's global step out of max_steps, which
also stays right on a resumed run (it starts at the checkpoint's step, not at 0).

`grpokit fit|train` swaps Lightning's default bar for the matching one here (`use_step_progress_bar`);
a bar the recipe configures itself is left alone.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

DESCRIPTION = "GRPO step"


class CountsSteps:
    """What both bars change: the total is max_steps and the count is the global step (Lightning's
    bars show batch_idx + 1, so they are handed global_step - 1 as the batch index); `description`
    names the step ("GRPO step", "SFT step")."""

    description = DESCRIPTION

    @property
    def total_train_batches(self) -> int:
        return self.trainer.max_steps

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, trainer.global_step - 1)


class StepRichProgressBar(CountsSteps, RichProgressBar):
    """Lightning's rich bar, counting global steps out of max_steps."""

    def _get_train_description(self, current_epoch: int) -> str:
        return self.description


class StepTQDMProgressBar(CountsSteps, TQDMProgressBar):
    """Lightning's tqdm bar, counting global steps out of max_steps."""

    def on_train_start(self, trainer: L.Trainer, *args: Any) -> None:
        super().on_train_start(trainer, *args)
        self._count_steps(trainer)  # a resumed run (mid-epoch) gets no on_train_epoch_start

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any) -> None:
        super().on_train_epoch_start(trainer, *args)
        self._count_steps(trainer)

    def _count_steps(self, trainer: L.Trainer) -> None:
        bar = self.train_progress_bar
        bar.total, bar.initial = trainer.max_steps, trainer.global_step
        bar.set_description(self.description)


def use_step_progress_bar(trainer: L.Trainer, description: str = DESCRIPTION) -> None:
    """Replace Lightning's default progress bar (exactly RichProgressBar or TQDMProgressBar, as Lightning
    builds it when enable_progress_bar is on) by its step-counting twin, keeping its settings."""
    for i, bar in enumerate(trainer.callbacks):
        if type(bar) is RichProgressBar:
            trainer.callbacks[i] = StepRichProgressBar(
                refresh_rate=bar.refresh_rate, leave=bar._leave, theme=bar.theme, console_kwargs=bar._console_kwargs
            )
            trainer.callbacks[i].description = description
        elif type(bar) is TQDMProgressBar:
            trainer.callbacks[i] = StepTQDMProgressBar(
                refresh_rate=bar.refresh_rate, process_position=bar.process_position, leave=bar._leave
            )
            trainer.callbacks[i].description = description
