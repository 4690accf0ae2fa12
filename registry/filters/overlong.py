"""Overlong filtering (DAPO, Yu et al. 2025): a completion cut at max_tokens without EOS has a reward
for an answer it never finished; masking it keeps that noise out of the gradient while its reward
still counts in the group baseline.

It reads the rollout's finish reason (grpokit.inference.finish): "length" (max_tokens, or a multi-turn
rollout's token budget) is flagged; "stop" is not, and neither is "abort" (a request cut by an abort, an
error or a timeout before it finished): that one never reached max_tokens, so `filter/overlong` counts
only max_tokens cuts, and the orchestrator keeps aborted rollouts out of the loss itself, filter or no
filter (counted in `rollout/finish_abort`).
"""

from __future__ import annotations

from grpokit.filter import Filter
from grpokit.types import Rollout


class Overlong(Filter):
    """Flags completions that hit max_tokens without a stop (finish reason "length"), not aborted ones."""

    def flag(self, rollouts: list[Rollout]) -> list[bool]:
        return [r.finish_reason == "length" for r in rollouts]
