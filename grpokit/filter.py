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
