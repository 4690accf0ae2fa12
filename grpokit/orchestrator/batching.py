"""Batch arithmetic: grpokit's names and ms-swift/TRL's aliases, resolved and checked once at start.

One generation samples `generation_batch_size` rollouts (`num_generations` per prompt) with one weight
version; it is split into `steps_per_generation` optimizer steps of `batch_size` rollouts, and the whole
generation is trained on `num_iterations` times (mu, GRPO's inner epochs), so a generation feeds
steps_per_generation * num_iterations optimizer steps. grpokit's `rollouts_per_example` is
ms-swift's `num_generations`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpokit.advantage import Advantage


@dataclass(frozen=True)
class BatchShape:
    batch_size: int
    rollouts_per_example: int
    steps_per_generation: int
    num_iterations: int

    @property
    def prompts_per_step(self) -> int:
        return self.batch_size // self.rollouts_per_example

    @property
    def steps_per_rollout_generation(self) -> int:
        """Optimizer steps fed by one generation."""
        return self.steps_per_generation * self.num_iterations

    def locate(self, step: int) -> tuple[int, int, int]:
        """(generation, chunk, iteration) of an optimizer step; chunks cycle fastest."""
        generation, within = divmod(step, self.steps_per_rollout_generation)
        iteration, chunk = divmod(within, self.steps_per_generation)
        return generation, chunk, iteration


def resolve_batch_shape(
    batch_size: int | None,
    rollouts_per_example: int | None,
    generation_batch_size: int | None,
    steps_per_generation: int | None,
    num_generations: int | None,
    num_iterations: int,
) -> BatchShape:
    """Check the combination and fill what was left out; errors state the formula they break."""
    if rollouts_per_example is not None and num_generations is not None and rollouts_per_example != num_generations:
        raise ValueError(
            f"data.rollouts_per_example ({rollouts_per_example}) and its "
            f"alias data.num_generations ({num_generations}) disagree: set one"
        )
    g = next((v for v in (rollouts_per_example, num_generations) if v is not None), 8)
    if g < 1:
        raise ValueError(f"data.rollouts_per_example must be >= 1 (completions per prompt, the group size G), got {g}")
    if num_iterations < 1:
        raise ValueError(
            f"data.num_iterations must be >= 1 (optimizer passes over one generation), got {num_iterations}"
        )
    if generation_batch_size is not None:
        batch_size, steps_per_generation = _split_generation(generation_batch_size, g, batch_size, steps_per_generation)
    batch_size = 32 if batch_size is None else batch_size
    steps_per_generation = 1 if steps_per_generation is None else steps_per_generation
    if g < 1 or batch_size < 1 or batch_size % g:
        raise ValueError(
            f"data.batch_size ({batch_size}) must be a positive multiple of "
            f"data.rollouts_per_example ({g}): batch_size = prompts per step * rollouts_per_example"
        )
    if steps_per_generation < 1:
        raise ValueError(f"data.steps_per_generation must be >= 1, got {steps_per_generation}")
    return BatchShape(batch_size, g, steps_per_generation, num_iterations)


def _split_generation(
    generation_batch_size: int, g: int, batch_size: int | None, steps_per_generation: int | None
) -> tuple[int, int]:
    """(batch_size, steps_per_generation) for a given data.generation_batch_size of groups of `g` rollouts:
    fill whichever of the two was left out (steps_per_generation 1 when both were) and check that
    batch_size * steps_per_generation makes up the generation."""
    if generation_batch_size % g:
        raise ValueError(
            f"data.generation_batch_size ({generation_batch_size}) % "
            f"data.num_generations ({g}) must be 0: a generation holds whole groups"
        )
    if batch_size is None and steps_per_generation is None:
        steps_per_generation = 1
    if batch_size is None:
        if generation_batch_size % steps_per_generation:
            raise ValueError(
                f"data.generation_batch_size ({generation_batch_size}) % "
                f"data.steps_per_generation ({steps_per_generation}) must be 0"
            )
        batch_size = generation_batch_size // steps_per_generation
    elif steps_per_generation is None:
        if generation_batch_size % batch_size:
            raise ValueError(
                f"data.generation_batch_size ({generation_batch_size}) "
                f"must be a multiple of data.batch_size ({batch_size})"
            )
        steps_per_generation = generation_batch_size // batch_size
    elif batch_size * steps_per_generation != generation_batch_size:
        raise ValueError(
            f"data.generation_batch_size ({generation_batch_size}) must equal data.batch_size "
            f"({batch_size}) * data.steps_per_generation ({steps_per_generation})"
        )
    return batch_size, steps_per_generation


def check_group_size(advantage: Advantage, rollouts_per_example: int) -> None:
    """Refuse groups of one rollout when the advantage has nothing to compare them with.

    A group-relative advantage (GroupNorm, DrGRPO, LeaveOneOut, ...) of a lone rollout is 0 (or 0/0):
    every step would train on nothing, silently. The advantage itself is asked, on four groups of one
    with different rewards, so one whose baseline is the batch (ReinforcePP without the group mean)
    still runs with G = 1.
    """
    if rollouts_per_example > 1:
        return
    rewards_P1 = torch.tensor([[0.0], [1.0], [0.5], [2.0]], dtype=torch.float64)
    advantages_P1 = advantage(rewards_P1, torch.ones_like(rewards_P1))
    if not torch.isfinite(advantages_P1).all() or (advantages_P1 == 0).all():
        raise ValueError(
            f"data.rollouts_per_example is 1, and data.advantage {type(advantage).__name__} gives a group of one "
            "rollout advantage 0 (nothing would be learned): set data.rollouts_per_example >= 2, or use an "
            "advantage with a batch baseline (ReinforcePP with subtract_group_mean: false)"
        )
