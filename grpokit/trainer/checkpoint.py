"""Checkpoints of a run, written atomically, and the lookup of the one to resume from.

A checkpoint is Lightning's (weights, optimizer, LR scheduler, loop progress), reduced to the trainable
weights (the LoRA adapter, or everything for full fine-tuning) by Policy.on_save_checkpoint. It is
written to a temp file and renamed, so a crash never leaves a truncated `step_N.ckpt`. The prompt
position and the sampling seed of step n are functions of n; the orchestrator's only state, the easy
and hard pools, is a log with the generation of every entry (`buffer.jsonl`, orchestrator/pools.py),
so it gives the state at any checkpoint's step.

Resuming (`resume_step`): -1 takes the newest checkpoint that is whole, passing over (with a warning
naming the file and why) one that is empty or cut short. A resume from a checkpoint older than the
newest abandons the history after it: archive_abandoned_history moves the later checkpoints (and, in
co-locate `fit`, the later batches) to `archive/after_step_<N>_<time>/`, so neither a later
`resume_step -1` nor the resumed rollout thread picks up files of a future that no longer happens.

`skip_progress` loads only the trainable weights and restarts the count at step 0 (prompt order,
optimizer, LR schedule: all fresh); the files of the earlier count move to `archive/progress_<time>/`
so the new steps never meet stale batches or weights. `skip_buffer` restores no pools.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch

from grpokit.common.io import atomic_path
from grpokit.trainer.fsdp import load_full_state_dict
from grpokit.transport import Transport

log = logging.getLogger(__name__)
CKPT = re.compile(r"^step_(\d+)\.ckpt$")
BATCH = re.compile(r"^step_(\d+)\.safetensors$")  # FilesystemTransport's rollouts/step_N.safetensors


@dataclass
class CheckpointSettings:
    """When to write checkpoints and which one to resume from.

    Args:
        interval: write a checkpoint every `interval` steps and at the last step (0: never).
        keep_last: checkpoints kept (older ones are deleted), >= 1.
        keep_interval: also keep every checkpoint whose step is a multiple of this (0: none).
        resume_step: null starts fresh; -1 resumes from the newest checkpoint of the run (`run_name`
            must name the earlier run); N resumes from step N.
        skip_progress: load only the checkpoint's trainable weights and count from step 0 again: the
            prompt order, optimizer state and LR schedule restart; the earlier count's files (batches,
            broadcasts, checkpoints, metrics, samples) move to `archive/progress_<time>/`.
        skip_buffer: do not restore the orchestrator's easy/hard pools (data.buffer): every example is
            sampled again.
    """

    interval: int = 10
    keep_last: int = 2
    keep_interval: int = 0
    resume_step: int | None = None
    skip_progress: bool = False
    skip_buffer: bool = False

    def __post_init__(self) -> None:
        if self.interval < 0 or self.keep_last < 1 or self.keep_interval < 0:
            raise ValueError(f"ckpt: interval >= 0, keep_last >= 1 and keep_interval >= 0 are required, got {self}")
        for name in ("skip_progress", "skip_buffer"):
            if getattr(self, name) and self.resume_step is None:
                raise ValueError(
                    f"ckpt.{name} applies when resuming: set ckpt.resume_step (-1 for the newest checkpoint) too"
                )


def checkpoint_steps(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := CKPT.match(p.name)))


def checkpoint_problem(path: Path) -> str | None:
    """Why `path` is not a whole checkpoint (None: it looks whole), without loading its tensors.

    torch.save writes a zip archive whose central directory comes last, so a file cut short (a copy
    interrupted, a disk that filled, a filesystem that lost the tail in a crash) has none. Each record
    carries a CRC-32, so bytes flipped inside one (a bad disk, a bad copy) are found by reading the file
    once. Last, the file is loaded weights-only and memory-mapped (the tensors are not read): a checkpoint
    that pickles other objects is refused here, as the resume would refuse it, instead of a traceback.
    """
    try:
        size = path.stat().st_size
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if size == 0:
        return "empty (0 bytes)"
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            if not any(name.rpartition("/")[2] == "data.pkl" for name in names):
                return "not a torch checkpoint (its zip archive has no data.pkl)"
            damaged = archive.testzip()  # each record against its CRC-32: one read of the file
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        return f"truncated or not a checkpoint ({size} bytes, no complete zip archive: {e})"
    if damaged is not None:
        return f"damaged ({damaged.rpartition('/')[2]} fails its CRC-32 check: bytes changed after it was written)"
    try:  # what only a load tells: a pickle of objects other than tensors and plain data
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        return f"not loadable as weights only ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
    return None


def resume_path(folder: Path, resume_step: int) -> tuple[Path, int]:
    """The checkpoint file for `resume_step` (-1 = newest) and its step; a clear error if there is none.

    -1 passes over newer checkpoints that are not whole (checkpoint_problem), with a warning naming each
    and why, and takes the newest whole one: the run loses the steps since it, not the run. An explicit
    step is taken or refused as asked: a resume never silently lands elsewhere than the user named.
    """
    folder = Path(folder)
    steps = checkpoint_steps(folder)
    if not steps:
        raise FileNotFoundError(_no_checkpoint_message(folder, resume_step))
    if resume_step != -1:
        if resume_step not in steps:
            raise FileNotFoundError(
                f"ckpt.resume_step={resume_step}: no checkpoint of step {resume_step} in {folder} (have {steps})"
            )
        path = folder / f"step_{resume_step}.ckpt"
        if problem := checkpoint_problem(path):
            others = [s for s in steps if s != resume_step]
            raise ValueError(
                f"ckpt.resume_step={resume_step}: {path} is {problem}; resume from another step ({others})"
            )
        return path, resume_step
    passed = []
    for step in reversed(steps):
        path = folder / f"step_{step}.ckpt"
        problem = checkpoint_problem(path)
        if problem is None:
            for bad, why in passed:
                log.warning(
                    "ckpt.resume_step=-1: %s is %s; resuming from %s, the newest whole one", bad, why, path.name
                )
            return path, step
        passed.append((path, problem))
    raise ValueError(
        f"ckpt.resume_step=-1: no checkpoint in {folder} can be loaded: "
        + "; ".join(f"{p.name} is {why}" for p, why in passed)
    )


def _no_checkpoint_message(folder: Path, resume_step: int) -> str:
    """A run folder that exists (killed before its first checkpoint) or one that does not (a typo in
    run_name or output_dir) need different fixes."""
    run_dir = folder.parent
    if run_dir.is_dir():
        return (
            f"ckpt.resume_step={resume_step}: the run folder {run_dir} exists but has no checkpoint yet (it "
            "stopped before its first: one is written every ckpt.interval steps): start it over with the same "
            "--run_name and no --ckpt.resume_step (grpokit fit moves the earlier attempt's files to "
            f"{run_dir / 'archive'}/attempt_<time>/)"
        )
    runs = sorted(p.parent.name for p in run_dir.parent.glob("*/checkpoints") if checkpoint_steps(p))
    return (
        f"ckpt.resume_step={resume_step}: no checkpoints in {folder} (no such run folder); set --run_name (and "
        "--output_dir) to a run that has some"
        + (f": {', '.join(runs[-5:])} in {run_dir.parent}" if runs else f" (no run in {run_dir.parent} has any)")
    )


def archive_abandoned_history(run_dir: Path, step: int, batches: bool) -> Path | None:
    """Before a resume from the checkpoint of `step`: move the files of the history the resume abandons to
    `archive/after_step_<step>_<time>/` (kept, not deleted: they hold hours of training, and moving them
    back resumes that history). Returns the archive (None: nothing to move).

    - Checkpoints of later steps: a later `--ckpt.resume_step -1` would otherwise pick one of them, and
      continue a history this run no longer has.
    - With `batches` (co-locate `fit`, whose own rollout thread is the only writer of rollouts/): batch
      files this run must not train on. If later checkpoints existed, the batches of `step` and later:
      they may have been sampled with weights of the abandoned steps (the resume may also change the
      recipe), so the rollout thread samples every step from `step` again. Otherwise (a resume of the
      newest checkpoint after a kill) the batches from `step` up to the first missing one are the killed
      run's own and are trained as they are; any after that gap belong to a later history and move.
      Temp files a killed batch writer left are deleted.

    Published weights of later steps are not kept here: the trainer discards them before it publishes
    (WeightBroadcast.discard_after), and the archived checkpoints hold the same weights.
    """
    run_dir = Path(run_dir)
    later = [s for s in checkpoint_steps(run_dir / "checkpoints") if s > step]
    moves = [(run_dir / "checkpoints" / f"step_{s}.ckpt", "checkpoints") for s in later]
    if batches and (run_dir / "rollouts").is_dir():
        for tmp in (run_dir / "rollouts").glob(".step_*.tmp"):
            tmp.unlink(missing_ok=True)
        on_disk = {int(m.group(1)): p for p in (run_dir / "rollouts").iterdir() if (m := BATCH.match(p.name))}
        first_moved = step  # later checkpoints: every batch from `step` on; else those after the first gap
        while not later and first_moved in on_disk:
            first_moved += 1
        moves += [(p, "rollouts") for s, p in sorted(on_disk.items()) if s >= first_moved]
    if not moves:
        return None
    dest = run_dir / "archive" / time.strftime(f"after_step_{step}_%Y%m%d-%H%M%S")
    for path, sub in moves:
        (dest / sub).mkdir(parents=True, exist_ok=True)
        os.replace(path, dest / sub / path.name)
    return dest


def archive_progress(run_dir: Path) -> Path:
    """Move everything in the run folder to `archive/progress_<time>/`, except earlier archives.

    `buffer.jsonl` (the easy/hard pools) is copied, not moved: the restarted count restores it.
    Returns the archive folder.
    """
    run_dir = Path(run_dir)
    dest = run_dir / "archive" / time.strftime("progress_%Y%m%d-%H%M%S")
    dest.mkdir(parents=True, exist_ok=False)
    for item in sorted(run_dir.iterdir()):
        if item.name == "archive":
            continue
        if item.name == "buffer.jsonl":
            shutil.copy2(item, dest / item.name)
        else:
            os.replace(item, dest / item.name)
    return dest


def newest_archive(run_dir: Path) -> Path:
    """The newest `archive/progress_<time>/` of a run (archive_progress's names sort by time)."""
    archives = sorted((Path(run_dir) / "archive").glob("progress_*"))
    if not archives:
        raise FileNotFoundError(
            f"ckpt.skip_progress: no checkpoints in {run_dir}/checkpoints and no archive/progress_* in {run_dir}"
        )
    return archives[-1]


def check_no_earlier_run(run_dir: Path) -> None:
    """Refuse to start a run from step 0 in a folder whose checkpoints belong to an earlier run: its
    metrics would be overwritten, its samples and timeline appended to, and a later resume would pick
    the earlier run's newest checkpoint."""
    steps = checkpoint_steps(Path(run_dir) / "checkpoints")
    if steps:
        raise ValueError(
            f"{run_dir} already holds a run with checkpoints (steps {', '.join(map(str, steps[-3:]))}): "
            "resume it with --ckpt.resume_step -1, start a new count from its weights with "
            "--ckpt.resume_step -1 --ckpt.skip_progress true, or choose another --run_name"
        )


# what a run writes into its folder while it trains (a sweep's overrides.yaml, resolved.yaml and log.txt are not)
RUN_OUTPUTS = (
    "rollouts",
    "broadcasts",
    "broadcasts_ipc",
    "bad_batches",
    "metrics.csv",
    "samples.jsonl",
    "eval.jsonl",
    "timeline.jsonl",
    "buffer.jsonl",
    "replayed.jsonl",
)


def archive_unfinished_attempt(run_dir: Path) -> Path | None:
    """Move the outputs of an earlier attempt that stopped before its first checkpoint to
    `archive/attempt_<time>/` before a fresh `grpokit fit` starts in the same folder; returns the archive
    (None: the folder holds no batches). Without this, the new run's trainer would read the earlier
    attempt's rollouts/step_N batches as its own (they exist before the new orchestrator rewrites them)
    and append to its samples. With no checkpoint there is nothing to resume, so starting over is the
    only choice; the archive keeps the earlier files. Only co-located `fit` calls it: in the
    multi-process roles a batch already in rollouts/ may be the running orchestrator's."""
    run_dir = Path(run_dir)
    if not any((run_dir / "rollouts").glob("step_*")):
        return None
    dest = run_dir / "archive" / time.strftime("attempt_%Y%m%d-%H%M%S")
    dest.mkdir(parents=True, exist_ok=False)
    for name in RUN_OUTPUTS:
        if (run_dir / name).exists():
            os.replace(run_dir / name, dest / name)
    return dest


def started_as_other_rank() -> bool:
    """Whether a launcher started this process as a trainer rank other than global rank 0 (Lightning's
    launcher sets LOCAL_RANK / NODE_RANK for the ranks it starts; torchrun sets RANK), before any
    process group exists."""
    ranks = (os.environ.get("RANK"), os.environ.get("LOCAL_RANK"), os.environ.get("NODE_RANK"))
    return any(int(r or 0) > 0 for r in ranks)


class LoadWeights(L.Callback):
    """Loads a checkpoint's trainable weights into the policy when fit starts (ckpt.skip_progress).

    Runs at on_fit_start, after configure_model built the model and before the step-0 weights are
    published, so the engine samples step 0 with these weights. The checkpoint is read from the newest
    archive (rank 0 archived the earlier count before the trainer's ranks met, so every rank finds it).
    """

    def __init__(self, run_dir: Path, relative: Path) -> None:
        self.run_dir, self.relative = Path(run_dir), Path(relative)

    @property
    def path(self) -> Path:
        return newest_archive(self.run_dir) / self.relative

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = torch.load(self.path, map_location="cpu", weights_only=True)["state_dict"]
        expected = dict(pl_module.named_parameters()).keys() | dict(pl_module.named_buffers()).keys()
        unexpected = sorted(state.keys() - expected)
        if unexpected or not state:
            raise ValueError(
                f"ckpt.skip_progress: {self.path} holds weights the model lacks "
                f"({unexpected[:3]}): was it written with another model or LoRA setup?"
            )
        if getattr(pl_module, "sharded", False):  # FSDP2: every rank loads its shards of the full tensors
            load_full_state_dict(pl_module, state)
            return
        pl_module.load_state_dict(state, strict=False)


class Checkpointer(L.Callback):
    """Writes `checkpoints/step_N.ckpt` (N = optimizer steps done) every `interval` steps and at the end."""

    def __init__(self, folder: Path, settings: CheckpointSettings, transport: Transport | None = None) -> None:
        """`transport` hears the step of every checkpoint (Transport.retain_from), so it keeps the batches
        that a trainer resumed from that checkpoint reads again."""
        self.folder, self.settings, self.transport = Path(folder), settings, transport
        self.started_at = 0  # the step training (re)started at

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Keep the batches from the step training (re)starts at; delete temp files a killed writer left."""
        self.started_at = trainer.global_step
        if self.transport is not None:
            self.transport.retain_from(trainer.global_step)
        if trainer.is_global_zero:
            for tmp in self.folder.glob(".step_*.ckpt.*.tmp"):
                tmp.unlink(missing_ok=True)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step == self.started_at:  # no step trained (a signal ended `grpokit train`'s wait for its first batch)
            return
        if step % self.settings.interval == 0 or step >= trainer.max_steps:
            self.save(trainer, step)
        elif trainer.should_stop:  # training ends early (Ctrl-C: StopOnInterrupt): keep the steps done
            self.save(trainer, step)
            if trainer.is_global_zero:
                log.warning("training stops early: checkpoint of step %d written to %s", step, self.folder)

    def save(self, trainer: L.Trainer, step: int) -> None:
        final = self.folder / f"step_{step}.ckpt"
        # a full disk, say: no partial file stays behind, earlier checkpoints are untouched
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with atomic_path(final, self.folder / f".step_{step}.ckpt.{os.getpid()}.tmp") as tmp:
                trainer.save_checkpoint(tmp, weights_only=False)  # all ranks join, rank 0 writes; full state
        except OSError as e:
            raise OSError(
                e.errno, f"cannot write the checkpoint {final} ({e.strerror}); the earlier checkpoints are unchanged"
            ) from e
        if not trainer.is_global_zero:
            return
        self._prune(step)
        if self.transport is not None:
            self.transport.retain_from(step)

    def _prune(self, newest: int) -> None:
        steps = checkpoint_steps(self.folder)
        keep = set(steps[-self.settings.keep_last :])
        if self.settings.keep_interval:
            keep |= {s for s in steps if s % self.settings.keep_interval == 0}
        for s in steps:
            if s not in keep and s < newest:
                (self.folder / f"step_{s}.ckpt").unlink(missing_ok=True)
