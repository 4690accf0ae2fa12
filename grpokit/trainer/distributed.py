"""The trainer on several processes (Lightning's DDP): how a step's batch reaches every rank, which
micro-batches each rank trains, and how their results are summed.

Design, for a step with M micro-batches on W ranks:
- Rank 0 alone reads the batch from the transport (a ZMQ PULL socket can be bound once, and PUSH would
  deal messages out round-robin; the filesystem transport deletes old files as it reads) and broadcasts
  it to the other ranks over the trainer's process group, as the same safetensors bytes the transport
  carries (no pickle; grpokit.transport.share_batch). One reader keeps every transport unchanged.
- Rank r trains micro-batches r, r + W, r + 2W, ... A rank left without one (M < W) runs the step's last
  micro-batch with its loss mask zeroed: its gradient is exactly 0, and its backward still joins DDP's
  all-reduce, which every rank must reach once per step.
- Every backward but a rank's last runs under `no_sync` (Lightning's `block_backward_sync`), so each rank
  all-reduces once per step. DDP averages gradients over W ranks and the loss is normalised by the whole
  step's loss tokens, so each rank scales its loss by W: the averaged gradient is then the sum over all M
  micro-batches, the single-process gradient up to float summation order.
- The step's loss and per-micro-batch metrics are gathered from every rank (JSON bytes), so each rank's
  numerics guard takes the same decision and rank 0 logs the whole step.
- Only rank 0 runs the engine and the orchestrator (`grpokit fit`) and publishes weights.
- FSDP2 (`trainer.strategy: fsdp2`, grpokit.trainer.fsdp) follows the same plan; there every rank runs as many
  micro-batches as the busiest one and joins the gather of the weights rank 0 publishes.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from grpokit.common.collectives import all_gather_json
from grpokit.types import MicroBatch


def rank_share(
    micro_batches: list[MicroBatch], rank: int, world: int, equal: bool = False
) -> list[tuple[MicroBatch, bool]]:
    """This rank's (micro-batch, counts) pairs: round-robin, or one zero-loss stand-in when none is left.

    `equal` (FSDP2, where every forward and backward is a collective): every rank gets ceil(M / W)
    pairs, the short ones padded with zero-loss stand-ins."""
    mine = [(mb, True) for mb in micro_batches[rank::world]]
    if not micro_batches:
        return mine
    wanted = -(-len(micro_batches) // world) if equal else max(len(mine), 1)
    return mine + [(zero_loss(micro_batches[-1]), False)] * (wanted - len(mine))


def zero_loss(mb: MicroBatch) -> MicroBatch:
    """`mb` with its loss mask, expert mask and advantages zeroed: its gradient is exactly 0."""
    zeros_T = torch.zeros_like(mb.loss_mask_T)
    return replace(mb, loss_mask_T=zeros_T, expert_mask_T=zeros_T, advantages_T=torch.zeros_like(mb.advantages_T))


def gather_step(
    loss: float, metrics: list[dict[str, torch.Tensor]], weights: list[float]
) -> tuple[float, list[dict[str, float]], list[float]]:
    """The step's loss summed over ranks, and every rank's per-micro-batch metrics and weights."""
    mine = {"loss": loss, "metrics": [{k: float(v) for k, v in m.items()} for m in metrics], "weights": weights}
    parts = all_gather_json(mine)
    return (
        sum(p["loss"] for p in parts),
        [m for p in parts for m in p["metrics"]],
        [w for p in parts for w in p["weights"]],
    )


FSDP1_REFUSAL = (
    "trainer.strategy fsdp (Lightning's FSDP1): use trainer.strategy: fsdp2, grpokit's FSDP2 strategy "
    "(grpokit.trainer.fsdp; shards each decoder layer, runs on CUDA and on CPU)"
)
DEEPSPEED_REFUSAL = (
    "grpokit trains on several processes with DDP (trainer.strategy: ddp; every rank holds the whole model) "
    "or FSDP2 (trainer.strategy: fsdp2; each rank holds a shard). DeepSpeed is not supported"
)


def check_strategy_name(strategy) -> None:
    """Refuse Lightning's FSDP1 and DeepSpeed by the recipe's strategy name, before Lightning builds the
    Trainer (whose own errors for them on a CPU, "requires a GPU accelerator" or "pip install deepspeed",
    would point away from the fix)."""
    name = strategy.lower() if isinstance(strategy, str) else ""
    if name.startswith("fsdp") and name != "fsdp2":
        raise ValueError(FSDP1_REFUSAL)
    if name.startswith("deepspeed"):
        raise ValueError(f"trainer.strategy {strategy}: {DEEPSPEED_REFUSAL}")


def check_trainer_processes(trainer, run_name_given: bool) -> None:
    """Refuse a trainer spread over several processes in a way grpokit cannot run, naming the fix."""
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy

    strategy = trainer.strategy
    if isinstance(strategy, FSDPStrategy):
        raise ValueError(FSDP1_REFUSAL)
    if isinstance(strategy, ModelParallelStrategy) and strategy._tensor_parallel_size not in (1, "auto"):
        raise ValueError(
            "trainer.strategy ModelParallelStrategy with tensor_parallel_size "
            f"{strategy._tensor_parallel_size}: grpokit shards with FSDP2 only; use trainer.strategy: fsdp2"
        )
    if trainer.world_size == 1:
        return
    if not isinstance(strategy, (DDPStrategy, ModelParallelStrategy)) or isinstance(strategy, DeepSpeedStrategy):
        raise ValueError(f"trainer.strategy {type(strategy).__name__}: {DEEPSPEED_REFUSAL}")
    if getattr(strategy, "_start_method", "popen") != "popen":
        raise ValueError(
            f"trainer.strategy ddp_{strategy._start_method}: use trainer.strategy: "
            "ddp (or torchrun/SLURM). Spawned or forked ranks would get a pickled "
            "copy of the objects this process built, engine and orchestrator included"
        )
    if not run_name_given:
        raise ValueError(
            f"the trainer runs as {trainer.world_size} processes (trainer.devices x trainer.num_nodes): set "
            "--run_name, so that they share one folder output_dir/run_name (each would otherwise name its own)"
        )
