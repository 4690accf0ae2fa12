"""A classifier reward model on a server of its own: `grpokit judge` serving the recipe's classifier
(grpokit.judges.server), asked over HTTP by the orchestrator.

    POST {base_url}/rewards  {"model": "<judge.model>", "conversations": [[{"role", "content"}, ...], ...]}
    -> {"object": "list", "model": "<judge.model>", "scores": [float | null, ...]}   (null: not finite)

The server renders each conversation with the reward model's own chat template and scores it as the
in-process ClassifierReward does (it runs one), so the scores are the same model's whichever side runs
it, and the cache key (`identity`) is the same too. A batch of conversations goes in requests of at most
`max_batch_size`, one after another; a request that gets no answer after its retries (grpokit.judges.posting)
fails each of its conversations with "timeout" or "down", counted and settled by the failure policy.
"""

from __future__ import annotations

import json
import math
from typing import Any

from grpokit.judges.backends import JudgeReply
from grpokit.judges.posting import Failure, json_headers, post_json

REWARDS_PATH = "/rewards"


class RemoteClassifier:
    """Scores conversations with a reward model served at `base_url` (`grpokit judge`)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_var: str | None = None,
        timeout: float = 60.0,
        retries: int = 2,
        max_batch_size: int = 64,
    ) -> None:
        self.headers = json_headers(api_key_var)
        if retries < 0 or timeout <= 0:
            raise ValueError("judge: retries must be >= 0 and timeout > 0")
        self.url = base_url.rstrip("/") + REWARDS_PATH
        self.model, self.timeout, self.retries, self.max_batch_size = model, timeout, retries, max_batch_size
        self.identity = f"classifier:{model}"  # as in process: the same model's scores

    def judge_conversations(self, conversations: list[list[dict[str, Any]]]) -> list[JudgeReply]:
        """One reply per conversation: its score as text ("nan" for a null), or the request's failure."""
        out: list[JudgeReply] = []
        for start in range(0, len(conversations), self.max_batch_size):
            chunk = conversations[start : start + self.max_batch_size]
            payload = {"model": self.model, "conversations": chunk}
            answer = post_json(self.url, payload, self.headers, self.timeout, self.retries, self._reader(len(chunk)))
            if isinstance(answer, Failure):
                out.extend(JudgeReply(None, answer.kind, answer.detail) for _ in chunk)
            else:
                out.extend(JudgeReply(repr(math.nan if s is None else float(s))) for s in answer)
        return out

    def _reader(self, count: int):
        def read(raw: bytes) -> list[float | None]:
            """The answer's scores; ValueError naming the server for anything but `count` numbers or nulls."""
            try:
                scores = json.loads(raw)["scores"]
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{self.url} answered {raw[:200]!r}: not a rewards answer") from None
            ok = isinstance(scores, list) and len(scores) == count and all(map(is_score, scores))
            if not ok:
                raise ValueError(f"{self.url} answered scores {str(scores)[:200]}: expected {count} numbers or nulls")
            return scores

        return read


def is_score(value) -> bool:
    """A number (not a bool) or null: what a rewards answer's scores hold."""
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))
