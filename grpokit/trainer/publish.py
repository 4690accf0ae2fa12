"""What the trainer publishes to the engine after a step: its trainable weights as a WeightUpdate (the
LoRA adapter, or every weight for full fine-tuning) and, with a QeRL noise scheduler, the engine's
noisy RMSNorm weights for that step.

Sharded (FSDP2), every rank must call weight_update: full fine-tuning gathers the whole model onto rank
0's CPU (the other ranks get an update without tensors; they never publish), LoRA gathers only the
adapter's shards, on every rank.
"""

from __future__ import annotations

import os

import torch

from grpokit.common.noisy_norms import noisy_norms, norm_weights
from grpokit.common.weight_probe import trainer_probe
from grpokit.noise import NoiseScheduler
from grpokit.trainer.fsdp import full_state_dict, full_tensors, is_sharded
from grpokit.trainer.lora import LoraSettings, adapter_tensors
from grpokit.types import WeightUpdate


def weight_update(
    lm: torch.nn.Module, lora: LoraSettings | None, step: int, norm_tensors: dict, probe: bool = False
) -> WeightUpdate:
    """`lm`'s trainable weights as the WeightUpdate of `step` (the adapter only when LoRA is on); with
    `probe`, its logprobs of the weight probe (grpokit.common.weight_probe), which an engine that cannot
    show its tensors (vLLM) is checked against. Off otherwise: the probe's forward is a new input shape
    for compiled layers."""
    sharded = is_sharded(lm)
    probe = trainer_probe(lm) if probe else None
    if lora is None:
        tensors = full_state_dict(lm) if sharded else {k: v.detach().clone() for k, v in lm.state_dict().items()}
        return WeightUpdate(step=step, tensors=tensors, norm_tensors=norm_tensors, probe=probe)
    tensors, config_dict = adapter_tensors(lm, sharded)
    return WeightUpdate(step=step, tensors=tensors, lora_config=config_dict, norm_tensors=norm_tensors, probe=probe)


def noise_sigma(scheduler: NoiseScheduler | None, step: int, max_steps: int) -> float:
    """Sigma of the QeRL noise on the weights published as `step` (0 without an enabled scheduler)."""
    if scheduler is None or not scheduler.enabled:
        return 0.0
    return scheduler.sigma(step, max_steps)


def noisy_norm_weights(
    lm: torch.nn.Module, scheduler: NoiseScheduler | None, step: int, max_steps: int
) -> dict[str, torch.Tensor]:
    """The engine's RMSNorm weights for `step`: the trainer's clean ones + N(0, sigma(step)^2), a function
    of (seed_everything, step) alone; {} without an enabled noise scheduler. `lm` is not touched."""
    if scheduler is None or not scheduler.enabled:
        return {}
    seed = int(os.environ.get("PL_GLOBAL_SEED", "0"))  # the recipe's seed_everything (LightningCLI sets it)
    clean = full_tensors(norm_weights(lm)) if is_sharded(lm) else norm_weights(lm)
    return noisy_norms(clean, noise_sigma(scheduler, step, max_steps), seed, step)
