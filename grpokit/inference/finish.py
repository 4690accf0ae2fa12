"""Finish reasons: why a completion ended, in vLLM's names (its FinishReason), so no cut completion is
taken for a natural stop (issue 35; peers trained aborted requests as natural stops).

- "stop": the model ended it (EOS, a stop token id or a stop string): a natural stop.
- "length": it reached max_tokens (or a conversation's token budget) without a stop.
- "abort": its request was cut before it finished and nothing continued it: a server's abort, error or
  timeout (vLLM's "abort" and "error"), or a request cancelled before its completion was done.

Every engine records one on each Completion (grpokit.inference.Completion.finish_reason); the
orchestrator keeps it on the Rollout, hands it to the reward (the verifiers trace, see
grpokit.environments.finish) and the filters, logs it in samples.jsonl and counts it in the
`rollout/finish_<reason>` metrics. An "abort" rollout keeps its reward in its group's baseline but is not
trained on (docs/environments.md "Finish reasons"). A leaf module: streams import it at run time.
"""

from __future__ import annotations

FINISH_REASONS = ("stop", "length", "abort")
NATURAL_STOPS = ("stop", "tool_calls", "function_call")  # OpenAI's names for a reply that ended by itself


def server_finish_reason(value: object) -> str:
    """A server's `finish_reason` as one of FINISH_REASONS: OpenAI's natural stops are "stop", "length"
    stays, and anything else (vLLM's "abort" and "error", "content_filter", none at all) is "abort": an
    answer that does not say it ended by itself is not taken for a natural stop."""
    if value == "length":
        return "length"
    return "stop" if value in NATURAL_STOPS else "abort"
