"""The trainer sharded over several processes with PyTorch's FSDP2 (`fully_shard`), through Lightning.

`--trainer.strategy fsdp2` names `FSDP2Strategy`: Lightning's ModelParallelStrategy (the FSDP2 +
DeviceMesh strategy) with every process in one data-parallel dimension (no tensor parallelism) and
checkpoints assembled into one file on rank 0. Lightning's own `fsdp` (FSDP1) refuses a CPU and wraps
the model before grpokit can see it; FSDP2 shards inside `Policy.configure_model`, runs on CUDA (NCCL)
and on CPU (gloo, which is how CI tests it), and keeps parameter names unchanged, so checkpoints,
adapters and published weights look exactly as on one device.

What sharding changes in a GRPO step (the rest is the DDP design of grpokit.trainer.distributed):
- Each decoder layer is one FSDP unit (`shard_model`): its parameters are all-gathered for its forward
  and backward and freed after, and gradients are reduce-scattered (averaged over ranks, as DDP does).
- Every forward and backward is a collective, so every rank runs the same number of micro-batches
  (`rank_share(..., equal=True)` pads with zero-loss stand-ins) and only the last one reduce-scatters
  (`set_requires_gradient_sync`).
- Publishing needs the full weights: every rank joins `full_state_dict` (an all-gather; rank 0 gets the
  tensors on the CPU, the others nothing) and rank 0 publishes (grpokit.trainer.callbacks.WeightSync).
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry

from grpokit.common.models import decoder_layers


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ModelParallelStrategy as plain FSDP2: one data-parallel dimension over all processes,
    full-state checkpoints (one `step_N.ckpt` file, written by rank 0, loadable on any world size)."""

    strategy_name = "fsdp2"

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("save_distributed_checkpoint", False)
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1, **kwargs)

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes  # all ranks shard one model
        super().setup_environment()

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="grpokit: FSDP2 (fully_shard) over all processes, CPU or CUDA"
        )


if "fsdp2" not in StrategyRegistry:
    FSDP2Strategy.register_strategies(StrategyRegistry)


def is_fsdp(strategy) -> bool:
    """Whether Lightning's `strategy` shards the model with FSDP2 (grpokit's fsdp2 or ModelParallelStrategy)."""
    return isinstance(strategy, ModelParallelStrategy)


def shard_model(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """fully_shard every decoder layer, then the root (embeddings, final norm, LM head) over the
    data-parallel dimension of Lightning's device mesh. In place; returns `model`."""
    from torch.distributed.fsdp import fully_shard

    layers = decoder_layers(
        model, "trainer.strategy fsdp2: {model} has no model.layers to shard; use trainer.strategy: ddp"
    )
    dp_mesh = mesh["data_parallel"] if mesh.mesh_dim_names and "data_parallel" in mesh.mesh_dim_names else mesh
    for layer in layers:
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    return model


def is_sharded(model: torch.nn.Module | None) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return model is not None and isinstance(model, FSDPModule)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) weights of a sharded `model` on the CPU, on rank 0; {} on other ranks.
    A collective: every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each DTensor (a shard) in `tensors` gathered into a plain tensor on every rank; others as they
    are. A collective when any is a DTensor: every rank must call it with the same keys in the same order."""
    from torch.distributed.tensor import DTensor

    return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in tensors.items()}


def load_full_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load full (unsharded) tensors into a sharded `model`; missing keys keep their values. A collective.
    `state` is left as it is (torch would replace its values by shards)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, dict(state), options=StateDictOptions(full_state_dict=True, strict=False))
