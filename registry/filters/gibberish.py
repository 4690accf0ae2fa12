"""Gibberish filtering (arXiv 2510.02387 Section 5.2, Meta FAIR's CWM report; the rule of prime-rl's and
Surogate's `gibberish` filter): a rollout is flagged when any token the policy sampled is both rare and
improbable,

    id(y_t) > token_id_threshold  and  log pi(y_t) < -log(vocab_size) - logprob_offset

i.e. a late BPE merge (ids are assigned in merge order, so high ids are rare) drawn with less than
e^-logprob_offset times the uniform probability 1 / vocab_size. Such a token is usually the first symptom
of a policy drifting into noise, and training on it pushes the drift further.

Defaults follow the policy: vocab_size is its tokenizer's vocabulary, len(tokenizer) (the filter learns
it when the rollout loop connects it), and token_id_threshold is int(0.75 * vocab_size), the rule of
prime-rl's built-in detector (SmolLM2: 49_152 and 36_864; Qwen2.5: 151_665 and 113_748). logprob_offset
2.0 is prime-rl's and Surogate's published one, with the offset subtracted, so the same value means the
same threshold there and here. Explicit values are kept; for a model whose embedding is padded past its
tokenizer (Qwen: 151_936 rows) set vocab_size to the rows to match prime-rl exactly (the uniform logprob
moves by log(151_936 / 151_665) = 0.002). prime-rl's published fixed threshold, 100_000 with vocab_size
151_936, fits Qwen only: on a smaller vocabulary no id exceeds it and the filter would never flag, so a
threshold at or past the tokenizer's last id is an error when the filter connects. Only tokens the policy
wrote (completion_mask 1) are checked; environment tokens were not sampled.
"""

from __future__ import annotations

import math

from grpokit.filter import Filter
from grpokit.types import Rollout


class Gibberish(Filter):
    """Flags completions with a rare token (high id) sampled well below uniform probability."""

    def __init__(
        self,
        token_id_threshold: int | None = None,
        vocab_size: int | None = None,
        logprob_offset: float = 2.0,
        enforce: bool = True,
    ) -> None:
        """
        Args:
            token_id_threshold: token ids above this are rare candidates; must be below vocab_size - 1.
                Default (null): int(0.75 * vocab_size).
            vocab_size: the policy's vocabulary size, which sets the uniform logprob -log(vocab_size).
                Default (null): the policy tokenizer's, len(tokenizer).
            logprob_offset: how far below the uniform logprob a candidate must be sampled to count;
                the threshold is -log(vocab_size) - logprob_offset.
            enforce: mask flagged rollouts out of the loss (True) or only count them (False).
        """
        super().__init__(enforce=enforce)
        if token_id_threshold is not None and token_id_threshold < 0:
            raise ValueError(
                f"Gibberish token_id_threshold must be >= 0 (or null for 0.75 * vocab_size), got {token_id_threshold}"
            )
        self.logprob_offset = logprob_offset
        self._threshold_arg = token_id_threshold
        self.token_id_threshold: int | None = None  # these three are set from vocab_size, here or by connect()
        self.vocab_size: int | None = None
        self.logprob_threshold: float | None = None
        if vocab_size is not None:
            self._set_vocab_size(vocab_size)

    def _set_vocab_size(self, vocab_size: int) -> None:
        if vocab_size < 2:
            raise ValueError(f"Gibberish vocab_size must be the policy's vocabulary size (>= 2), got {vocab_size}")
        threshold = int(0.75 * vocab_size) if self._threshold_arg is None else self._threshold_arg
        if not 0 <= threshold < vocab_size - 1:
            raise ValueError(
                f"Gibberish token_id_threshold={threshold} leaves no token id "
                f"above it in a vocabulary of {vocab_size}: set it in [0, vocab_size - "
                "1), e.g. int(0.75 * vocab_size), or set vocab_size to your tokenizer's"
            )
        self.token_id_threshold, self.vocab_size = threshold, vocab_size
        self.logprob_threshold = -math.log(vocab_size) - self.logprob_offset

    def connect(self, tokenizer) -> None:
        """Take vocab_size from the policy's tokenizer unless it was set; refuse a token_id_threshold
        that no id of this tokenizer exceeds (the filter would never flag)."""
        size = len(tokenizer)
        if self.vocab_size is None:
            self._set_vocab_size(size)
        if self.token_id_threshold >= size - 1:
            raise ValueError(
                f"data.filters Gibberish: token_id_threshold={self.token_id_threshold} is at or past the last id "
                f"({size - 1}) of the policy's tokenizer, so the filter would never flag a rollout; leave "
                "token_id_threshold and vocab_size unset (they follow the tokenizer) or set them for this tokenizer"
            )

    def flag(self, rollouts: list[Rollout]) -> list[bool]:
        if self.vocab_size is None:
            raise RuntimeError(
                "Gibberish has no vocab_size: the rollout loop sets it from the policy's tokenizer "
                "(connect(tokenizer)); outside it, call connect or pass vocab_size"
            )
        return [self._is_gibberish(r) for r in rollouts]

    def _is_gibberish(self, r: Rollout) -> bool:
        return any(
            m == 1 and token_id > self.token_id_threshold and logprob < self.logprob_threshold
            for token_id, logprob, m in zip(r.completion_ids, r.completion_logprobs, r.completion_mask)
        )
