"""Checkpoints of a run, written atomically, and the lookup of the one to resume from.

A checkpoint is Lightning's (weights, optimizer, LR scheduler, loop progress), reduced to the trainable
weights (the LoRA adapter, or everything for full fine-tuning) by Policy.on_save_checkpoint. It is
written to a temp file and renamed, so a crash never leaves a truncated `step_N.ckpt`. The orchestrator
needs no state of its own: the prompt position and the sampling seed of step n are functions of n.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import lightning as L

CKPT = re.compile(r"^step_(\d+)\.ckpt$")


@dataclass
class CheckpointSettings:
    """When to write checkpoints and which one to resume from.

    Args:
        interval: write a checkpoint every `interval` steps and at the last step (0: never).
        keep_last: checkpoints kept (older ones are deleted), >= 1.
        keep_interval: also keep every checkpoint whose step is a multiple of this (0: none).
        resume_step: null starts fresh; -1 resumes from the newest checkpoint of the run (`run_name`
            must name the earlier run); N resumes from step N.
    """

    interval: int = 10
    keep_last: int = 2
    keep_interval: int = 0
    resume_step: int | None = None

    def __post_init__(self) -> None:
        if self.interval < 0 or self.keep_last < 1 or self.keep_interval < 0:
            raise ValueError(f"ckpt: interval >= 0, keep_last >= 1 and keep_interval >= 0 are required, got {self}")


def checkpoint_steps(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := CKPT.match(p.name)))


def resume_path(folder: Path, resume_step: int) -> tuple[Path, int]:
    """The checkpoint file for `resume_step` (-1 = newest) and its step; a clear error if there is none."""
    steps = checkpoint_steps(folder)
    if not steps:
        raise FileNotFoundError(f"ckpt.resume_step={resume_step}: no checkpoints in {folder}; set run_name to the run to resume")
    step = steps[-1] if resume_step == -1 else resume_step
    if step not in steps:
        raise FileNotFoundError(f"ckpt.resume_step={resume_step}: no checkpoint of step {step} in {folder} (have {steps})")
    return folder / f"step_{step}.ckpt", step


class Checkpointer(L.Callback):
    """Writes `checkpoints/step_N.ckpt` (N = optimizer steps done) every `interval` steps and at the end."""

    def __init__(self, folder: Path, settings: CheckpointSettings) -> None:
        self.folder, self.settings = Path(folder), settings

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if step % self.settings.interval == 0 or step >= trainer.max_steps:
            self.save(trainer, step)

    def save(self, trainer: L.Trainer, step: int) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.folder / f"step_{step}.ckpt"
        tmp = self.folder / f".step_{step}.ckpt.{os.getpid()}.tmp"
        trainer.save_checkpoint(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
        self._prune(step)

    def _prune(self, newest: int) -> None:
        steps = checkpoint_steps(self.folder)
        keep = set(steps[-self.settings.keep_last :])
        if self.settings.keep_interval:
            keep |= {s for s in steps if s % self.settings.keep_interval == 0}
        for s in steps:
            if s not in keep and s < newest:
                (self.folder / f"step_{s}.ckpt").unlink(missing_ok=True)
