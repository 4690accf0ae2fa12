"""Reasoning steps of a completion: environments mark them in characters, advantages need tokens.

An environment reports each step of a reply by the character offset just past its end
(grpokit.environments.environment.Environment.step_rewards); `token_step_ends` maps those offsets to completion-token
indices through the tokenizer's own decoding, the same decoding that produced the reply text.
"""

from __future__ import annotations

from collections.abc import Callable


def token_step_ends(decode: Callable[[list[int]], str], token_ids: list[int], char_ends: list[int]) -> list[int]:
    """For each character end, the index of the first token whose decoded prefix reaches it.

    The prefix lengths len(decode(token_ids[: j + 1])) are non-decreasing in j, so each end is a binary
    search: O(log C) decodes per step. An end past the decoded text maps to the last token.
    """
    out = []
    for end in char_ends:
        lo, hi = 0, len(token_ids) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if len(decode(token_ids[: mid + 1])) >= end:
                hi = mid
            else:
                lo = mid + 1
        out.append(lo)
    return out


def rollout_steps(
    steps: list[tuple[int, float]] | None, token_ids: list[int], decode: Callable[[list[int]], str]
) -> dict:
    """The Rollout fields step_rewards and step_ends for an environment's (end character, reward) steps."""
    if steps is None:
        return {"step_rewards": None, "step_ends": None}
    return {
        "step_rewards": [r for _, r in steps],
        "step_ends": token_step_ends(decode, token_ids, [e for e, _ in steps]),
    }
