"""The `filter` kind: flags rollouts that should not be trained on (gibberish, repetition, overlong).

A flagged rollout stays in its group, so it still counts in the advantage baseline. With
`enforce: true` its tokens are masked out of the loss; with `enforce: false` the filter only monitors
(the flagged fraction is logged either way as `filter/<name>`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from grpokit.types import Rollout


class Filter(ABC):
    """Contract: `filter.flag(rollouts) -> list[bool]`, True where the rollout is flagged, after
    `filter.connect(tokenizer)`.

    Args:
        enforce: mask flagged rollouts out of the loss (True) or only count them (False).
    """

    enforce: bool = True  # a subclass whose __init__ skips super().__init__() still enforces

    def __init__(self, enforce: bool = True) -> None:
        self.enforce = enforce

    @property
    def name(self) -> str:
        return type(self).__name__.lower()

    def connect(self, tokenizer) -> None:
        """Called once by the rollout loop, before any flag(), with the policy's tokenizer (a Hugging
        Face tokenizer; len(tokenizer) is its vocabulary): a filter that depends on the vocabulary
        resolves it here rather than asking the recipe for it. Does nothing by default."""

    @abstractmethod
    def flag(self, rollouts: list[Rollout]) -> list[bool]:
        """Return one flag per rollout."""


def flag_all(filters: list[Filter], rollouts: list[Rollout]) -> dict[str, list[bool]]:
    """Each filter's flags, keyed by its metric name (`filter/<name>`): its `name`, or `name_2`, `name_3`
    for a second and third filter of the same name (two LongText filters with different limits, one
    enforcing and one watching, used to overwrite each other's flags). A filter that does not return one
    flag per rollout is refused, named."""
    flags: dict[str, list[bool]] = {}
    for f in filters:
        name, n = f.name, 2
        while name in flags:
            name, n = f"{f.name}_{n}", n + 1
        flags[name] = list(f.flag(rollouts))
        if len(flags[name]) != len(rollouts):
            raise ValueError(
                f"data.filters: {type(f).__name__}.flag returned {len(flags[name])} flags for {len(rollouts)} "
                "rollouts; a Filter returns one bool per rollout (grpokit.testing.check_component checks it)"
            )
    return flags
