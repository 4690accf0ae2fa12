"""Which groups of rollouts a step trains on, and which examples are sampled at all.

A group whose rewards are all equal has zero group-relative advantage: it costs a forward and backward
pass and teaches nothing. `online_difficulty_filtering` drops groups whose rewards are all 0 or all 1
(too hard or already solved); `dynamic_sampling` (DAPO, Yu et al. 2025) keeps generating further
prompts until the step has enough groups whose rewards differ, at most `max_resample_times` extra rounds.
`easy_threshold` / `hard_threshold` move examples out of the sampling pool for good (prime-rl's
buffer; grpokit/orchestrator/pools.py); `skip_verification` does not score at all.
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
        easy_threshold: an example whose group's mean reward is >= this moves to the easy pool and is not
            sampled again (its group is still trained on this once); null: no easy pool.
        hard_threshold: the same for mean reward <= this, into the hard pool; null: no hard pool.
        easy_fraction: share of the easy pool, drawn at random, that returns to sampling on each resume.
        hard_fraction: the same for the hard pool.
        hash_keys: example fields that identify an example (`env`, `prompt`, or a field of the task's
            data such as `answer`): examples with equal values are one example, sampled once per epoch
            and moved between pools together. null: every example of every environment is distinct.
        skip_verification: do not score completions; every reward is 0 (throughput tests, or losses
            that need no reward). Excludes every rule above that reads rewards.
        oversampling_factor: each generation round samples ceil(factor x the prompts it needs) and trains
            on the first groups the rules above keep (prime-rl's oversampling_factor): with filtering, a
            step is less often short of groups without a further round. 1 = no oversampling.
    """

    online_difficulty_filtering: bool = False
    dynamic_sampling: bool = False
    max_resample_times: int = 3
    easy_threshold: float | None = None
    hard_threshold: float | None = None
    easy_fraction: float = 0.0
    hard_fraction: float = 0.0
    hash_keys: list[str] | None = None
    skip_verification: bool = False
    oversampling_factor: float = 1.0

    def __post_init__(self) -> None:
        if not self.oversampling_factor >= 1 or self.oversampling_factor == float("inf"):
            raise ValueError(
                f"data.buffer.oversampling_factor must be a finite number >= 1, got {self.oversampling_factor}"
            )
        if self.max_resample_times < 0:
            raise ValueError(f"data.buffer.max_resample_times must be >= 0, got {self.max_resample_times}")
        if (
            self.easy_threshold is not None
            and self.hard_threshold is not None
            and self.easy_threshold <= self.hard_threshold
        ):
            raise ValueError(
                f"data.buffer.easy_threshold ({self.easy_threshold}) must be > "
                f"data.buffer.hard_threshold ({self.hard_threshold}): an example cannot be both"
            )
        for pool, fraction, threshold in (
            ("easy", self.easy_fraction, self.easy_threshold),
            ("hard", self.hard_fraction, self.hard_threshold),
        ):
            if not 0 <= fraction <= 1:
                raise ValueError(
                    f"data.buffer.{pool}_fraction must be in [0, 1] (share "
                    f"of the {pool} pool returned on resume), got {fraction}"
                )
            if fraction and threshold is None:
                raise ValueError(
                    f"data.buffer.{pool}_fraction is set but data.buffer.{pool}_threshold "
                    f"is not: there is no {pool} pool to return examples from"
                )
        if self.hash_keys is not None and not self.hash_keys:
            raise ValueError("data.buffer.hash_keys must name at least one example field (e.g. [prompt]), or be null")
        if self.skip_verification:
            uses_rewards = [
                name
                for name, on in (
                    ("online_difficulty_filtering", self.online_difficulty_filtering),
                    ("dynamic_sampling", self.dynamic_sampling),
                    ("easy_threshold", self.easy_threshold is not None),
                    ("hard_threshold", self.hard_threshold is not None),
                )
                if on
            ]
            if uses_rewards:
                raise ValueError(
                    "data.buffer.skip_verification leaves every reward 0, so "
                    f"data.buffer.{uses_rewards[0]} cannot work: unset one of them"
                )

    @property
    def uses_pools(self) -> bool:
        """Whether examples can leave the sampling pool (an easy or hard threshold is set)."""
        return self.easy_threshold is not None or self.hard_threshold is not None

    def pool_of(self, mean_reward: float) -> str:
        """The pool of an example whose group has this mean reward: easy, hard or normal."""
        if self.easy_threshold is not None and mean_reward >= self.easy_threshold:
            return "easy"
        if self.hard_threshold is not None and mean_reward <= self.hard_threshold:
            return "hard"
        return "normal"

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
