"""Gibberish filtering (arXiv 2510.02387 Section 5.2, Meta FAIR's CWM report; the rule of prime-rl's and
Surogate's `gibberish` filter): a rollout is flagged when any token the policy sampled is both rare and
improbable,

    id(y_t) > token_id_threshold  and  log pi(y_t) < -log(vocab_size) - logprob_offset

i.e. a late BPE merge (ids are assigned in merge order, so high ids are rare) drawn with less than
e^-logprob_offset times the uniform probability 1 / vocab_size. Such a token is usually the first symptom
of a policy drifting into noise, and training on it pushes the drift further.

Defaults are prime-rl's and Surogate's published ones (token_id_threshold 100_000, logprob_offset 2.0,
with the offset subtracted, so the same value means the same threshold there and here), with
vocab_size set for Qwen2/2.5/3 (151_936 rows in the embedding). Departures: prime-rl reads vocab_size
from the model, and a filter here only sees rollouts, so it is an argument; prime-rl's built-in
detector now puts token_id_threshold at 0.75 * vocab_size, which for another tokenizer is a reasonable
choice (SmolLM2: vocab_size 49_152, token_id_threshold 36_864). Only tokens the policy wrote
(completion_mask 1) are checked; environment tokens were not sampled.
"""

from __future__ import annotations

import math

from grpokit.filter import Filter
from grpokit.types import Rollout


class Gibberish(Filter):
    """Flags completions with a rare token (high id) sampled well below uniform probability."""

    def __init__(
        self,
        token_id_threshold: int = 100_000,
        vocab_size: int = 151_936,
        logprob_offset: float = 2.0,
        enforce: bool = True,
    ) -> None:
        """
        Args:
            token_id_threshold: token ids above this are rare candidates; must be below vocab_size - 1.
            vocab_size: the policy's vocabulary size (embedding rows), which sets the uniform logprob
                -log(vocab_size).
            logprob_offset: how far below the uniform logprob a candidate must be sampled to count;
                the threshold is -log(vocab_size) - logprob_offset.
            enforce: mask flagged rollouts out of the loss (True) or only count them (False).
        """
        super().__init__(enforce=enforce)
        if vocab_size < 2:
            raise ValueError(f"Gibberish vocab_size must be the policy's vocabulary size (>= 2), got {vocab_size}")
        if not 0 <= token_id_threshold < vocab_size - 1:
            raise ValueError(
                f"Gibberish token_id_threshold={token_id_threshold} leaves no token id "
                f"above it in a vocabulary of {vocab_size}: set it in [0, vocab_size - "
                "1), e.g. int(0.75 * vocab_size), or set vocab_size to your tokenizer's"
            )
        self.token_id_threshold = token_id_threshold
        self.vocab_size = vocab_size
        self.logprob_offset = logprob_offset
        self.logprob_threshold = -math.log(vocab_size) - logprob_offset

    def flag(self, rollouts: list[Rollout]) -> list[bool]:
        return [self._is_gibberish(r) for r in rollouts]

    def _is_gibberish(self, r: Rollout) -> bool:
        return any(
            m == 1 and token_id > self.token_id_threshold and logprob < self.logprob_threshold
            for token_id, logprob, m in zip(r.completion_ids, r.completion_logprobs, r.completion_mask)
        )
