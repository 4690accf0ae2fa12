"""Finish reasons on the verifiers trace a reward function reads (grpokit.inference.finish names them).

verifiers v1 rubrics see a reply's end as its trace's model calls (`trace.calls[i].finish_reason`,
"stop" or "length") and `trace.is_truncated` (the last call ended at "length"); grpokit scores its own
engine's replies on a trace it builds, so it records them there the same way, one ModelCall per sampled
assistant message, in order. grpokit's own names are in `trace.info["finish_reason"]` (the last reply's)
and `trace.info["finish_reasons"]` (every reply's), "abort" included: verifiers' FinishReason has no
"abort", so an aborted reply's call has finish_reason None and the trace's stop_condition is "aborted".
A reward function that reads none of them is unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)
ABORTED = "aborted"  # trace.stop_condition of a rollout whose last reply was aborted


def record_finish_reasons(trace: Any, reasons: list[str] | None) -> Any:
    """Record `reasons` (one per sampled assistant message, in order) on `trace`; None leaves it as it is
    (a caller that knows none, e.g. `grpokit eval` on text alone). Returns the trace."""
    if not reasons:
        return trace
    from verifiers.v1.trace import ModelCall

    sampled = [i for i, node in enumerate(trace.nodes) if node.sampled]  # the engine's replies, in order
    pairs = zip(sampled[-len(reasons) :], reasons[-len(sampled) :] if sampled else [])  # the last ones pair up
    trace.calls = [ModelCall(node=i, finish_reason=r if r in ("stop", "length") else None) for i, r in pairs]
    trace.info["finish_reason"], trace.info["finish_reasons"] = reasons[-1], list(reasons)
    if reasons[-1] == "abort":
        trace.stop_condition = ABORTED
    return trace


def masked_if_aborted(mask: list[int], reason: str | None, env_name: str, example_index: int) -> list[int]:
    """A rollout's completion mask: as it is, or all 0 when its (last) reply was aborted. An aborted reply
    never finished, so training on it would teach its cut end as if the model had stopped there (a peer's
    bug: aborted requests trained as natural stops); its reward, which saw the "abort", stays in its
    group's baseline, as a non-finite rollout's does. Counted in the `rollout/finish_abort` metric."""
    if reason != "abort":
        return mask
    log.warning(
        "environment %r example %d: the engine aborted the completion before it finished (finish_reason "
        "'abort'); it is scored but masked out of the loss",
        env_name,
        example_index,
    )
    return [0] * len(mask)
