"""Filesystem weight broadcast: `{run_dir}/broadcasts/step_N/` with a `STABLE` marker written last.

A LoRA update is a standard peft adapter folder (adapter_model.safetensors + adapter_config.json), so
vLLM's LoRA hot reload can load it as is; a full update is model.safetensors. QeRL's noisy norm weights,
when a noise scheduler is on, lie beside them in noisy_norms.safetensors (outside the adapter files, so
the adapter stays loadable by anything that reads peft adapters). Readers only open folders that hold
STABLE, so they never see a half-written step.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from safetensors.torch import load_file

from grpokit.broadcast import WeightBroadcast
from grpokit.io import atomic_save_tensors, atomic_write_json, atomic_write_text
from grpokit.types import WeightUpdate

log = logging.getLogger(__name__)
ADAPTER_FILE, ADAPTER_CONFIG, FULL_FILE, STABLE = "adapter_model.safetensors", "adapter_config.json", "model.safetensors", "STABLE"
NORMS_FILE = "noisy_norms.safetensors"


class FilesystemBroadcast(WeightBroadcast):
    """Weights as folders `broadcasts/step_N/`, complete once `STABLE` exists."""

    def __init__(self, keep_last: int = 3) -> None:
        """
        Args:
            keep_last: newest steps kept on disk (older ones are deleted after each publish); >= 2 so a
                reader loading the previous step is not raced by the deletion.
        """
        if keep_last < 2:
            raise ValueError(f"broadcast.init_args.keep_last must be >= 2, got {keep_last}")
        self.keep_last = keep_last

    @property
    def root(self) -> Path:
        return self.run_dir / "broadcasts"

    def step_dir(self, step: int) -> Path:
        return self.root / f"step_{step}"

    def publish(self, update: WeightUpdate) -> None:
        final = self.step_dir(update.step)
        if (final / STABLE).exists():
            return  # already published (a resumed run re-publishing the same step)
        tmp = self.root / f".step_{update.step}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        if update.lora_config is not None:
            atomic_save_tensors(tmp / ADAPTER_FILE, update.tensors, metadata={"format": "pt"})
            atomic_write_json(tmp / ADAPTER_CONFIG, update.lora_config)
        else:
            atomic_save_tensors(tmp / FULL_FILE, update.tensors, metadata={"format": "pt"})
        if update.norm_tensors:
            atomic_save_tensors(tmp / NORMS_FILE, update.norm_tensors, metadata={"format": "pt"})
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        atomic_write_text(final / STABLE, str(update.step))
        self._prune(update.step)

    def stable_steps(self) -> list[int]:
        if not self.root.exists():
            return []
        steps = [int(p.name[5:]) for p in self.root.glob("step_*") if p.name[5:].isdigit() and (p / STABLE).exists()]
        return sorted(steps)

    def poll(self, after_step: int) -> WeightUpdate | None:
        for step in reversed(self.stable_steps()):
            if step <= after_step:
                return None
            try:
                return self.read(step)
            except FileNotFoundError:  # pruned between listing and reading: try the next newest
                log.warning("broadcast step %d vanished while reading", step)
        return None

    def read(self, step: int) -> WeightUpdate:
        d = self.step_dir(step)
        norms = load_file(d / NORMS_FILE) if (d / NORMS_FILE).exists() else {}
        if (d / ADAPTER_FILE).exists():
            config = json.loads((d / ADAPTER_CONFIG).read_text())
            return WeightUpdate(step=step, tensors=load_file(d / ADAPTER_FILE), lora_config=config, path=str(d), norm_tensors=norms)
        return WeightUpdate(step=step, tensors=load_file(d / FULL_FILE), path=str(d), norm_tensors=norms)

    def _prune(self, newest: int) -> None:
        for step in self.stable_steps():
            if step <= newest - self.keep_last:
                (self.step_dir(step) / STABLE).unlink(missing_ok=True)  # unlisted first, then deleted
                shutil.rmtree(self.step_dir(step), ignore_errors=True)
