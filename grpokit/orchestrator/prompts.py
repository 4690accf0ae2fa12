"""Prompt order: the environments' examples walked in seeded shuffled epochs, as a function of the block.

Without `ratios` all environments' examples form one pool (stream 0). With `ratios` (one weight per
environment) each block of prompts holds a fixed number from each environment (largest-remainder
rounding of ratio * count), each environment walking its own stream. Block b of `count` prompts takes
positions [b * count, (b + 1) * count) of its stream, so a resumed run continues where it stopped.

Each epoch of a stream is one shuffle of the stream's pool. Two things shrink a pool:
- `key` (data.buffer.hash_keys): examples with equal keys are one example, the first one kept;
- `excluded(block)`: keys left out of an epoch that starts in `block` (the easy and hard pools of
  grpokit/orchestrator/pools.py). Within an epoch no example repeats, so leaving an example out from
  the next epoch on is the same as never sampling it again.
Without either, epoch e of a stream is exactly the e-th shuffle of all its examples.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from grpokit.environments.environment import Environment, Example

Item = tuple[Environment, Example]


def index_key(env: Environment, ex: Example) -> str:
    """The default identity of an example: its environment and index."""
    return f"{env.name}/{ex.index}"


@dataclass
class PromptSampler:
    """Walks the examples of the environments in a seeded shuffled order, epoch after epoch.

    `take(block, count)` returns the `count` prompts of block `block`; `next(count)` walks stream 0
    sequentially from `position` (evaluation's fixed prompt set).
    """

    envs: list[Environment]
    seed: int
    position: int = 0
    ratios: list[float] | None = None
    key: Callable[[Environment, Example], str] | None = None
    excluded: Callable[[int], set[str]] | None = None
    _epochs: dict[int, tuple[list[int], list[list[Item]]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.ratios is not None and (
            len(self.ratios) != len(self.envs) or min(self.ratios) < 0 or sum(self.ratios) <= 0
        ):
            raise ValueError(
                "data.env ratios must be one non-negative weight per "
                f"environment with a positive sum, got {self.ratios}"
            )
        self.pools = [self._unique([(env, ex) for env in self.envs for ex in env.examples])]
        self.pools += [self._unique([(env, ex) for ex in env.examples]) for env in self.envs]

    def key_of(self, env: Environment, ex: Example) -> str:
        """The identity of an example: its `key`, or its environment and index."""
        return self.key(env, ex) if self.key else index_key(env, ex)

    def _unique(self, items: list[Item]) -> list[Item]:
        if self.key is None:
            return items
        seen: set[str] = set()
        return [it for it in items if not ((k := self.key(*it)) in seen or seen.add(k))]

    def next(self, count: int) -> list[Item]:
        out = [self._pick(0, self.position + i, count) for i in range(count)]
        self.position += count
        return out

    def take(self, block: int, count: int) -> list[Item]:
        """The `count` prompts of block `block`."""
        if self.ratios is None:
            return [self._pick(0, block * count + i, count) for i in range(count)]
        return [self._pick(e + 1, block * n + i, n) for e, n in enumerate(self.counts(count)) for i in range(n)]

    def blocks_per_pass(self, count: int) -> int:
        """How many blocks of `count` prompts draw every example once (at least 1): the pooled examples
        // count, or with ratios, the blocks until the environment that runs out first is drawn once."""
        if self.ratios is None:
            return max(1, len(self.pools[0]) // count)
        per_env = [len(pool) // n for pool, n in zip(self.pools[1:], self.counts(count)) if n]
        return max(1, min(per_env))

    def counts(self, count: int) -> list[int]:
        """Prompts per environment in a block of `count` (largest remainder)."""
        total = sum(self.ratios)
        exact = [count * r / total for r in self.ratios]
        counts = [int(x) for x in exact]
        for i in sorted(range(len(exact)), key=lambda i: counts[i] - exact[i])[: count - sum(counts)]:
            counts[i] += 1
        return counts

    def _pick(self, stream: int, position: int, per_block: int) -> Item:
        starts, orders = self._epochs.setdefault(stream, ([], []))
        while not starts or position >= starts[-1] + len(orders[-1]):
            start = starts[-1] + len(orders[-1]) if starts else 0
            orders.append(self._epoch_order(stream, len(starts), start // per_block))
            starts.append(start)
        e = bisect.bisect_right(starts, position) - 1
        return orders[e][position - starts[e]]

    def _epoch_order(self, stream: int, epoch: int, block: int) -> list[Item]:
        excluded = self.excluded(block) if self.excluded else set()
        pool = [it for it in self.pools[stream] if self.key_of(*it) not in excluded] if excluded else self.pools[stream]
        if not pool:
            names = "all environments" if stream == 0 else f"environment {self.envs[stream - 1].name!r}"
            raise ValueError(
                f"every example of {names} is in the easy or hard pool: lower data.buffer.easy_threshold, "
                "raise data.buffer.hard_threshold, or resume with data.buffer.easy_fraction / hard_fraction > 0"
            )
        order = list(range(len(pool)))
        base = self.seed * 7919 + epoch  # stream 0 (the pooled order) keeps the seed formula results were measured with
        random.Random(base if stream == 0 else base * 31 + stream).shuffle(order)
        return [pool[i] for i in order]
