"""Repetition filtering (MiniMax-M1, arXiv 2506.13585, Section 3.2; the rule of prime-rl's and Surogate's
`repetition` filter): a rollout is flagged when it holds a run of at least `window` consecutive sampled
tokens each with

    log pi(y_t) > log(prob_threshold)

A policy caught in a loop emits its tokens with near certainty for thousands of steps; MiniMax-M1 cut
such generations early because their large, correlated gradients destabilised training.

Defaults are the published ones (window 3000, prob_threshold 0.99). A much shorter window (say 50)
would also catch ordinary confident text: copying part of the prompt, code boilerplate, the closing
steps of a derivation, runs that a well-trained policy produces at temperature 1 and that an enforcing
filter should not mask. The cost is that completions shorter than `window` are never flagged: recipes
with a small sampling.max_tokens that want this check set a window below it. As in prime-rl, only
tokens the policy wrote (completion_mask 1) count, and environment tokens between turns neither extend
nor break a run.
"""

from __future__ import annotations

import math

from grpokit.filter import Filter
from grpokit.types import Rollout


class Repetition(Filter):
    """Flags completions with `window` consecutive tokens each sampled with probability above `prob_threshold`."""

    def __init__(self, window: int = 3000, prob_threshold: float = 0.99, enforce: bool = True) -> None:
        """
        Args:
            window: consecutive near-certain tokens that make a loop (>= 1).
            prob_threshold: a token is near-certain when its sampling probability is strictly above this
                (in (0, 1); compared as logprob > log(prob_threshold)).
            enforce: mask flagged rollouts out of the loss (True) or only count them (False).
        """
        super().__init__(enforce=enforce)
        if window < 1:
            raise ValueError(f"Repetition window must be >= 1 (consecutive tokens), got {window}")
        if not 0 < prob_threshold < 1:
            raise ValueError(
                "Repetition prob_threshold must be in (0, 1) (a probability "
                f"no sampled token reaches at 1), got {prob_threshold}"
            )
        self.window = window
        self.prob_threshold = prob_threshold
        self.logprob_threshold = math.log(prob_threshold)

    def flag(self, rollouts: list[Rollout]) -> list[bool]:
        return [self._longest_run(r) >= self.window for r in rollouts]

    def _longest_run(self, r: Rollout) -> int:
        run = longest = 0
        for logprob, m in zip(r.completion_logprobs, r.completion_mask):
            if m != 1:
                continue
            run = run + 1 if logprob > self.logprob_threshold else 0
            longest = max(longest, run)
        return longest
