"""Which weights of a run `grpokit eval` samples with, and how they reach the engine.

A run folder holds weights in two places: `broadcasts/step_N/` (FilesystemBroadcast: what the engine
loaded during training, QeRL's noisy norms included; the newest few steps, older ones pruned) and
`checkpoints/step_N.ckpt` (every ckpt.interval steps; the trainable weights). A step is read from its
broadcast folder when it is there, the way a training engine loads a published update (`poll`); else
from its checkpoint: the policy is built, the checkpoint's trainable weights loaded into it (as
ckpt.skip_progress does) and its weight update published into a scratch broadcast folder beside the
eval's outputs, then read back, so every engine (vLLM loads an adapter by its folder) gets it the same way.
A checkpoint's update carries no QeRL noise (the noise is for exploration in training).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import yaml

from grpokit.broadcast.filesystem import FilesystemBroadcast
from grpokit.trainer.checkpoint import checkpoint_steps
from grpokit.types import WeightUpdate

log = logging.getLogger(__name__)


def run_steps(run_dir: Path) -> tuple[list[int], list[int]]:
    """(steps with a broadcast folder, steps with a checkpoint) of a run folder."""
    reader = FilesystemBroadcast()
    reader.setup(run_dir)
    return reader.stable_steps(), checkpoint_steps(run_dir / "checkpoints")


def pick_step(run_dir: Path, step: int | None) -> int:
    """`step`, or the newest step with weights (None); a ValueError listing the steps there if it has none."""
    if not run_dir.is_dir():
        raise ValueError(f"--ckpt {run_dir}: no such run folder; pass the folder of a run (output_dir/run_name)")
    published, saved = run_steps(run_dir)
    steps = sorted(set(published) | set(saved))
    if not steps:
        raise ValueError(
            f"--ckpt {run_dir}: the run has no weights yet (no broadcasts/step_N/ with STABLE, no "
            "checkpoints/step_N.ckpt); evaluate the base model with --base, or wait for its first step"
        )
    if step is None:
        return steps[-1]
    if step not in steps:
        raise ValueError(
            f"--step {step}: no weights of step {step} in {run_dir} (broadcasts: {published}, checkpoints: "
            f"{saved}); pass one of {steps}, or leave --step out for the newest ({steps[-1]})"
        )
    return step


def pipeline_init_from(run_dir: Path) -> list[str]:
    """`--model.init_from` flags for an eval of a run whose recipe names both stages (grpokit.cli.stages):
    such a recipe fills model.init_from from output_dir/sft.run_name, but the eval's output_dir is the run's
    folder (its scratch space), so it is given the SFT run the run itself started from (its config.yaml).
    They go before the recipe's flags, so an explicit `--model.init_from` still wins. Empty otherwise."""
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        return []
    config = yaml.safe_load(saved.read_text()) or {}
    init_from = (config.get("model") or {}).get("init_from")
    return ["--model.init_from", str(init_from)] if config.get("sft") and init_from else []


def check_same_model(run_dir: Path, model_name: str, init_from: str | None = None) -> None:
    """Refuse a run trained from another model than the recipe's (its saved config.yaml says which): another
    `model.model`, or another `model.init_from` (the SFT run whose weights its adapter was trained on)."""
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        return  # a run folder without its resolved recipe: the engine's load names a mismatch of shapes
    model = (yaml.safe_load(saved.read_text()) or {}).get("model", {})
    trained, trained_init = model.get("model"), model.get("init_from")
    if trained is not None and str(trained) != str(model_name):
        raise ValueError(
            f"--ckpt {run_dir} was trained from model {trained!r}, but the recipe names {model_name!r}: pass "
            f"the run's own recipe (--config {saved}) or --model.model {trained}"
        )
    if trained is not None and trained_init != init_from:
        raise ValueError(
            f"--ckpt {run_dir} was trained from model.init_from {trained_init!r}, but the recipe says {init_from!r}: "
            f"pass the run's own recipe (--config {saved}) or --model.init_from {trained_init}"
        )


def load_step(run_dir: Path, step: int, policy, scratch: Path) -> WeightUpdate:
    """The WeightUpdate of `step`: its broadcast folder, else its checkpoint published into `scratch`."""
    reader = FilesystemBroadcast()
    reader.setup(run_dir)
    try:
        update = reader.poll(step - 1, upto=step)
    finally:
        reader.close()  # withdraw the ack: an eval holds no steps of the run on disk
    if update is not None and update.step == step:
        return update
    return checkpoint_update(run_dir / "checkpoints" / f"step_{step}.ckpt", step, policy, scratch)


def checkpoint_update(path: Path, step: int, policy, scratch: Path) -> WeightUpdate:
    """A checkpoint's trainable weights as the update the trainer would have published for `step`: built
    on the recipe's policy (its model, LoRA settings), published to a FilesystemBroadcast in `scratch`."""
    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    policy.configure_model()
    expected = dict(policy.named_parameters()).keys() | dict(policy.named_buffers()).keys()
    unexpected = sorted(state.keys() - expected)
    if unexpected or not state:
        raise ValueError(
            f"{path} holds weights the recipe's model lacks ({unexpected[:3]}): was it written with another "
            "model or LoRA setup? Pass the run's own recipe (RUN_DIR/config.yaml)"
        )
    policy.load_state_dict(state, strict=False)
    update = policy.weight_update(step)
    update.norm_tensors = {}
    policy.lm = None  # the update holds what the engine needs: free the policy's copy of the model
    writer = FilesystemBroadcast()
    writer.setup(scratch)
    writer.discard_after(step - 1)  # an earlier eval's copy of this step may be of a run since retrained
    writer.publish(update)
    log.info("weights of step %d read from %s", step, path)
    return writer.read(step)
