"""Which groups of rollouts a step trains on: online difficulty filtering and DAPO's dynamic sampling.

A group whose rewards are all equal has zero group-relative advantage: it costs a forward and backward
pass and teaches nothing. `online_difficulty_filtering` drops groups whose rewards are all 0 or all 1
(too hard or already solved); `dynamic_sampling` (DAPO, Yu et al. 2025) keeps generating further
prompts until the step has enough groups whose rewards differ, at most `max_resample_times` extra rounds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BufferSettings:
    """Group selection rules of the orchestrator.

    Args:
        online_difficulty_filtering: drop groups whose rewards are all 0 or all 1.
        dynamic_sampling: generate more prompts until the step has batch_size / rollouts_per_example
            groups whose rewards are not all equal (DAPO); a step that still lacks them trains on what it has.
        max_resample_times: extra generation rounds dynamic sampling may use per step.
    """

    online_difficulty_filtering: bool = False
    dynamic_sampling: bool = False
    max_resample_times: int = 3

    def __post_init__(self) -> None:
        if self.max_resample_times < 0:
            raise ValueError(f"data.buffer.max_resample_times must be >= 0, got {self.max_resample_times}")

    @property
    def rounds(self) -> int:
        """Generation rounds a step may use (each round samples batch_size / rollouts_per_example prompts)."""
        return 1 + (self.max_resample_times if self.dynamic_sampling else 0)

    def keep(self, rewards: list[float]) -> bool:
        """Whether a group with these rewards is trained on."""
        if self.online_difficulty_filtering and (all(r == 0 for r in rewards) or all(r == 1 for r in rewards)):
            return False
        if self.dynamic_sampling and all(r == rewards[0] for r in rewards):
            return False
        return True
