"""The progress bars count GRPO steps out of trainer.max_steps ("GRPO step 3/5"), also on a resumed run."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

from grpokit.trainer.progress import DESCRIPTION, StepRichProgressBar, StepTQDMProgressBar, use_step_progress_bar


class Endless(L.LightningModule):
    """One linear layer trained on an endless stream, like a GRPO run (one epoch bounded by max_steps)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        class Stream(torch.utils.data.IterableDataset):
            def __iter__(self):
                while True:
                    yield torch.ones(2)

        return torch.utils.data.DataLoader(Stream(), batch_size=1)


def fit(tmp_path, bar, max_steps, ckpt_path=None):
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        callbacks=[bar],
        default_root_dir=tmp_path,
        enable_model_summary=False,
    )
    trainer.fit(Endless(), ckpt_path=ckpt_path)
    return trainer


def shown(bar) -> tuple[str, int, int]:
    """(description, count, total) the bar shows."""
    if isinstance(bar, RichProgressBar):
        task = bar.progress.tasks[bar.train_progress_bar_id]
        return task.description, int(task.completed), int(task.total)
    return bar.train_progress_bar.desc, bar.train_progress_bar.n, bar.train_progress_bar.total


@pytest.mark.parametrize("make", [StepTQDMProgressBar, StepRichProgressBar])
def test_counts_steps_out_of_max_steps_and_resumes(tmp_path, make):
    first = fit(tmp_path, make(), max_steps=3)
    description, count, total = shown(first.progress_bar_callback)
    assert DESCRIPTION in description and "Epoch" not in description
    assert (count, total) == (3, 3)
    ckpt = first.checkpoint_callback.best_model_path
    resumed = fit(tmp_path, make(), max_steps=5, ckpt_path=ckpt)
    assert shown(resumed.progress_bar_callback)[1:] == (5, 5)  # counts from the checkpoint's step 3, not from 0


@pytest.mark.parametrize(
    "default, twin", [(RichProgressBar, StepRichProgressBar), (TQDMProgressBar, StepTQDMProgressBar)]
)
def test_replaces_only_lightnings_default_bar(default, twin):
    trainer = L.Trainer(max_steps=1, callbacks=[default(leave=True)], logger=False)
    use_step_progress_bar(trainer)
    assert type(trainer.progress_bar_callback) is twin and trainer.progress_bar_callback._leave
    assert trainer.progress_bar_callback.description == DESCRIPTION == "GRPO step"
    trainer = L.Trainer(max_steps=1, callbacks=[default()], logger=False)
    use_step_progress_bar(trainer, "SFT step")  # grpokit sft's
    assert trainer.progress_bar_callback.description == "SFT step"

    class Own(TQDMProgressBar):
        pass

    trainer = L.Trainer(max_steps=1, callbacks=[Own()], logger=False)
    use_step_progress_bar(trainer)
    assert type(trainer.progress_bar_callback) is Own  # a recipe's own bar is left alone
