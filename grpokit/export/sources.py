"""A run folder as export reads it: the recipe it ran (config.yaml) and the trained weights of each step.

Two places hold a step's weights, and both are the trainer's clean weights:
- `checkpoints/step_N.ckpt` (grpokit.trainer.checkpoint.Checkpointer): Lightning's checkpoint, reduced
  by Policy.on_save_checkpoint to the trainable parameters under their `lm.` names (the LoRA adapter,
  or every weight of a full fine-tuning run; a tied LM head is one parameter). An FSDP2 run writes it
  whole on rank 0 (FSDP2Strategy, `save_distributed_checkpoint: False`); Lightning's sharded form, a
  folder of the same name with `.metadata` and `*.distcp` files, is read too.
- `broadcasts/step_N/` with `STABLE` (grpokit.trainer.publish -> grpokit.broadcast.filesystem): the
  WeightUpdate the engine loads. Its `tensors` are the trainer's own (QeRL's noisy RMSNorm weights lie
  apart, in noisy_norms.safetensors, and are never read here), so it is clean too.
A checkpoint is preferred for a step both have: it is written for keeping (`ckpt.keep_last`), while
broadcasts are pruned as the engine moves on and exist only with the filesystem broadcast. A broadcast
serves the steps no checkpoint holds (a run with `ckpt.interval: 0`, or steps between checkpoints).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from grpokit.broadcast.filesystem import FilesystemBroadcast
from grpokit.trainer.checkpoint import checkpoint_problem, checkpoint_steps
from grpokit.trainer.init_from import sft_model
from grpokit.trainer.lora import LoraSettings

CONFIG = "config.yaml"
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index file in a sharded checkpoint folder


@dataclass
class RunSettings:
    """The recipe's `model.*` keys that decide what the trained weights are."""

    model: str
    lora: LoraSettings | None
    dtype: str
    quantization: str | None

    @classmethod
    def read(cls, run_dir: Path) -> RunSettings:
        """The settings saved in `run_dir/config.yaml`; a folder without one is not a run folder."""
        path = Path(run_dir) / CONFIG
        if not path.is_file():
            raise FileNotFoundError(not_a_run_message(Path(run_dir)))
        model = (yaml.safe_load(path.read_text()) or {}).get("model") or {}
        if "model" not in model:
            raise ValueError(f"{path} has no model.model: it is not the config.yaml a grpokit run saves")
        lora = model.get("lora")
        return cls(  # a GRPO run started from an SFT run (model.init_from) trained on that run's weights
            model=model["model"] if not model.get("init_from") else sft_model(model["init_from"], model["model"]),
            lora=LoraSettings(**lora) if lora else None,
            dtype=model.get("dtype") or "float32",
            quantization=model.get("quantization"),
        )


def not_a_run_message(run_dir: Path) -> str:
    """Why `run_dir` is not a run folder, naming the run folders inside it when it is an output_dir."""
    if not run_dir.is_dir():
        return f"{run_dir}: no such folder; give a run folder (output_dir/run_name, e.g. outputs/run_<time>)"
    runs = sorted(p.parent.name for p in run_dir.glob(f"*/{CONFIG}"))
    hint = f"; it holds the runs {', '.join(runs[-5:])}: give one of them" if runs else ""
    return f"{run_dir} is not a grpokit run folder (it has no {CONFIG}, which every run saves){hint}"


class WeightSource(ABC):
    """One step's trained weights in a run folder, loaded into a model built like the trainer's."""

    def __init__(self, path: Path, step: int) -> None:
        self.path, self.step = Path(path), step

    @abstractmethod
    def load_into(self, lm: torch.nn.Module) -> None:
        """Put the weights into `lm` (a peft model for a LoRA run); raise ValueError if they do not fit it.
        Copied into its tensors (a tied head stays tied), or, where `lm` was built on the meta device (an
        adapter export needs no base weights), put in place of them."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path})"


class CheckpointFile(WeightSource):
    """`checkpoints/step_N.ckpt` as one file (torch.save's zip)."""

    def load_into(self, lm: torch.nn.Module) -> None:
        if problem := checkpoint_problem(self.path):
            raise ValueError(f"{self.path} is {problem}: export another step (--step)")
        state = torch.load(self.path, map_location="cpu", weights_only=True)["state_dict"]
        load_trainer_state(lm, state, self.path)


class ShardedCheckpoint(WeightSource):
    """`checkpoints/step_N.ckpt/` as Lightning's distributed checkpoint folder (FSDP2 shards): read
    whole in this one process, the tensors assembled from every rank's files."""

    def load_into(self, lm: torch.nn.Module) -> None:
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

        state = _load_state_dict_from_keys(keys={"state_dict"}, checkpoint_id=str(self.path))["state_dict"]
        load_trainer_state(lm, state, self.path)


class BroadcastFolder(WeightSource):
    """`broadcasts/step_N/` of the filesystem broadcast: a peft adapter folder or model.safetensors."""

    def load_into(self, lm: torch.nn.Module) -> None:
        broadcast = FilesystemBroadcast()
        broadcast.setup(self.path.parent.parent)
        update = broadcast.read(self.step)  # update.norm_tensors (QeRL's noisy norms) stay unused
        if (update.lora_config is not None) != hasattr(lm, "peft_config"):
            held = "full weights" if update.lora_config is None else "a LoRA adapter"
            raise ValueError(f"{self.path} holds {held}, unlike the run's config.yaml: was it copied from another run?")
        if update.lora_config is None:
            check_fit(lm, lm.load_state_dict(update.tensors, strict=False, assign=on_meta(lm)), self.path)
            return
        from peft import set_peft_model_state_dict

        check_fit(lm, set_peft_model_state_dict(lm, update.tensors, low_cpu_mem_usage=on_meta(lm)), self.path)


def load_trainer_state(lm: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """Load a checkpoint's `lm.`-prefixed trainable weights into `lm`, refusing a partial fit."""
    weights = {k.removeprefix("lm."): v for k, v in state.items() if k.startswith("lm.")}
    check_fit(lm, lm.load_state_dict(weights, strict=False, assign=on_meta(lm)), path)


def on_meta(lm: torch.nn.Module) -> bool:
    """Whether `lm` was built without weights (torch's meta device): loading must then assign tensors."""
    return any(p.is_meta for p in lm.parameters())


def check_fit(lm: torch.nn.Module, result, path: Path) -> None:
    """Every weight of `path` found a place in `lm`, and every trainable weight of `lm` got one (`result`:
    what load_state_dict, or peft's set_peft_model_state_dict, returned)."""
    trainable = {n for n, p in lm.named_parameters() if p.requires_grad}
    missing = sorted(k for k in result.missing_keys if k in trainable)
    if result.unexpected_keys or missing:
        raise ValueError(
            f"{path} does not fit the model its run's config.yaml describes (weights it has that the model lacks: "
            f"{result.unexpected_keys[:3]}; trained weights it lacks: {missing[:3]}): was it written by another run?"
        )


def step_sources(run_dir: Path) -> dict[int, WeightSource]:
    """Every step whose weights the run folder holds, each from its preferred source (checkpoint first)."""
    run_dir = Path(run_dir)
    sources: dict[int, WeightSource] = {}
    broadcasts = FilesystemBroadcast()
    broadcasts.setup(run_dir)
    for step in broadcasts.stable_steps():
        sources[step] = BroadcastFolder(broadcasts.step_dir(step), step)
    for step in checkpoint_steps(run_dir / "checkpoints"):
        path = run_dir / "checkpoints" / f"step_{step}.ckpt"
        sources[step] = ShardedCheckpoint(path, step) if (path / DCP_METADATA).is_file() else CheckpointFile(path, step)
    return dict(sorted(sources.items()))


def pick_source(run_dir: Path, step: int | None) -> WeightSource:
    """The weights of `step` (None: the newest step the run folder holds)."""
    sources = step_sources(run_dir)
    if not sources:
        raise FileNotFoundError(
            f"{run_dir} holds no trained weights yet: no checkpoints/step_N.ckpt and no broadcasts/step_N/STABLE "
            "(a run writes a checkpoint every ckpt.interval steps and at its last step)"
        )
    if step is None:
        return sources[max(sources)]
    if step not in sources:
        raise FileNotFoundError(
            f"--step {step}: {run_dir} holds no weights of step {step}; it has steps {list(sources)} "
            "(checkpoints, and broadcast steps not yet pruned): pick one, or leave --step out for the newest"
        )
    return sources[step]
