"""Overlong filtering (DAPO, Yu et al. 2025): a completion cut at max_tokens without EOS has a reward
for an answer it never finished; masking it keeps that noise out of the gradient while its reward
still counts in the group baseline."""

from __future__ import annotations

from grpokit.filter import Filter
from grpokit.types import Rollout


class Overlong(Filter):
    """Flags completions that hit max_tokens without an end-of-sequence token."""

    def flag(self, rollouts: list[Rollout]) -> list[bool]:
        return [r.is_truncated for r in rollouts]
