"""A reward from a model: the settings a recipe gives (`data.env[i].judge`), and the scoring of a batch of
conversations with the cache and the failure policy.

A judge's failure is never a silent 0. Each conversation's outcome is one of: scored, "parse" (a reply
with no score in it), "timeout", "down" (the endpoint refused or could not be reached after its
retries) or "nonfinite" (a classifier's NaN). A failure is logged (with the judge's reply or the error)
and counted, and `on_failure` decides what it is worth:
- "score": `failure_score` (a reward in the judge's [0, 1] scale, before the weight);
- "drop_group": the whole group gets reward 0 everywhere (grpokit.judges.judged_env), so its advantage is
  exactly 0 and the buffer rules (online_difficulty_filtering, dynamic_sampling) drop it;
- "stop": the run stops with an error naming the environment, the example and the failure;
- "retry": the failed requests are asked again (past the cache) up to `retries` rounds, then the run
  stops as with "stop".
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any

from grpokit.common.errors import RunDataError
from grpokit.judges.backends import BuiltinJudge, HTTPJudge, JudgeReply
from grpokit.judges.cache import JudgeCache, cache_key
from grpokit.judges.classifier import ClassifierReward
from grpokit.judges.queue import JudgeQueue
from grpokit.judges.remote_classifier import RemoteClassifier
from grpokit.judges.template import JudgeFormat, ParseFailure

log = logging.getLogger(__name__)
POLICIES = ("score", "drop_group", "stop", "retry")
KINDS = ("builtin", "http", "classifier")
FAILURES = ("parse", "timeout", "down", "nonfinite")


@dataclass
class JudgeSettings:
    """One judge reward of an environment (`data.env[i].judge`); its weighted score is added to the rubric's.

    Args:
        kind: "builtin" (its own model in this process), "http" (an OpenAI-compatible chat endpoint) or
            "classifier" (an AutoModelForSequenceClassification reward model: in this process, or with
            `base_url` on `grpokit judge`'s server).
        model: the judge's model: a path or name (builtin, classifier), the model name sent (http; the
            model `grpokit judge` serves there).
        rubric: what the judge grades by (builtin, http).
        weight: the judge reward's weight in the rollout's reward.
        name: the judge's metric name (env/judge/<name>/...; env/reward/<name> is its score).
        base_url, api_key_var: the endpoint (".../v1") and the environment variable holding its key (http;
            a classifier's server). `grpokit judge` serves the judge at this address.
        parser, score_range, verdicts, template: what the judge is asked and how its reply is read
            (grpokit.judges.template.JudgeFormat).
        max_tokens, temperature: the judge's sampling (0 = greedy, the default).
        timeout: seconds for a batch (builtin) or a request (http) before it counts as a timeout.
        retries: tries after the first of a failed request (http), and rounds of the "retry" policy.
        max_concurrency: requests of a batch in flight at once (http).
        device: where an in-process judge runs ("auto", "cpu", "cuda").
        on_failure, failure_score: the failure policy (see the module docstring).
        concurrent: judge on a thread of the judge's while the engine generates the next groups
            (grpokit.judges.queue); false judges each group before the rollout loop goes on.
        serve, startup_timeout: the run starts `grpokit judge` at `base_url` for its length and waits up
            to startup_timeout seconds for it (grpokit.judges.launch); false: a server already runs there.
    """

    kind: str
    model: str
    rubric: str = ""
    weight: float = 1.0
    name: str = "judge"
    base_url: str | None = None
    api_key_var: str | None = None
    parser: str = "score"
    score_range: tuple[float, float] = (0.0, 10.0)
    verdicts: dict[str, float] = field(default_factory=lambda: {"yes": 1.0, "no": 0.0})
    template: str | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    timeout: float = 60.0
    retries: int = 2
    max_concurrency: int = 8
    device: str = "auto"
    on_failure: str = "stop"
    failure_score: float = 0.0
    concurrent: bool = True
    serve: bool = False
    startup_timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"judge.kind must be one of {KINDS}, got {self.kind!r}")
        if self.on_failure not in POLICIES:
            raise ValueError(f"judge.on_failure must be one of {POLICIES}, got {self.on_failure!r}")
        if self.serve and not self.base_url:
            raise ValueError("judge.serve needs judge.base_url: the address the run starts `grpokit judge` at")
        if self.kind == "http" and not self.base_url:
            raise ValueError("judge.kind http needs judge.base_url (e.g. http://127.0.0.1:8000/v1)")
        if self.kind != "classifier" and not self.rubric.strip():
            raise ValueError(f"judge.kind {self.kind} needs judge.rubric: what the judge grades by")
        if not all(math.isfinite(x) for x in (self.weight, self.failure_score)):
            raise ValueError("judge.weight and judge.failure_score must be finite numbers")
        self.format = JudgeFormat(self.parser, tuple(self.score_range), dict(self.verdicts), self.template)

    @classmethod
    def from_recipe(cls, value: dict[str, Any], where: str) -> JudgeSettings:
        """The settings of a recipe's `judge` mapping; a bad key or value is a ValueError naming `where`."""
        if not isinstance(value, dict):
            raise ValueError(f"{where}: judge must be a mapping of settings, got {value!r}")
        unknown = sorted(set(value) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"{where}: unknown judge settings {unknown} (known: {[f.name for f in fields(cls)]})")
        try:
            return cls(**value)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from e

    @property
    def in_process_device(self) -> str:
        """Where a classifier runs in this process (or in `grpokit judge`'s): `device`, "auto" = the CPU."""
        return "cpu" if self.device == "auto" else self.device

    def backend(self):
        """The model that answers: a JudgeBackend, or a ClassifierReward."""
        if self.kind == "classifier" and self.base_url:
            return RemoteClassifier(self.base_url, self.model, self.api_key_var, self.timeout, self.retries)
        if self.kind == "classifier":
            return ClassifierReward(self.model, device=self.in_process_device)
        if self.kind == "builtin":
            return BuiltinJudge(self.model, self.max_tokens, self.temperature, self.timeout, self.device)
        return HTTPJudge(
            self.base_url, self.model, self.api_key_var, self.max_tokens, self.temperature, self.timeout,
            self.retries, self.max_concurrency,
        )  # fmt: skip


@dataclass
class Judged:
    """One conversation's judgement: its reward (None: a failure left to the policy), the failure's kind,
    and the judge's reply (or the error) for the log."""

    score: float | None
    failure: str | None
    reply: str
    seconds: float = 0.0  # the time of the judge batch it was in (cache hits included)


class JudgeReward:
    """Scores conversations with one judge: cached replies first, the rest asked as one batch."""

    def __init__(self, settings: JudgeSettings, cache: JudgeCache | None = None, merge: bool = False) -> None:
        self.settings, self.cache = settings, cache or JudgeCache()
        self.backend = settings.backend()
        self.counts: Counter = Counter()  # requests, cached, and each failure kind, over the run
        self.lock = threading.Lock()  # counts: updated from the judge's thread and the rollout loop's
        self.queue = JudgeQueue(self.judge, merge, name=settings.name)  # judging while the engine generates

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] += n

    def judge(self, conversations: list[list[dict[str, Any]]], labels: list[str]) -> list[Judged]:
        """Each conversation's Judged, the "retry" policy applied; `labels` name them in logs and errors."""
        start = time.monotonic()
        shown = [self.shown(c) for c in conversations]
        keys = [cache_key(self.backend.identity, s) for s in shown]
        out = self._ask(conversations, shown, keys, use_cache=True)
        rounds = self.settings.retries if self.settings.on_failure == "retry" else 0
        for _ in range(rounds):
            failed = [i for i, j in enumerate(out) if j.failure is not None]
            if not failed:
                break
            self.count("retried", len(failed))
            again = self._ask([conversations[i] for i in failed], [shown[i] for i in failed], [keys[i] for i in failed])
            for i, j in zip(failed, again):
                out[i] = j
        self.cache.save()
        seconds = time.monotonic() - start
        for j in out:
            j.seconds = seconds
        failed = [(label, j) for label, j in zip(labels, out) if j.failure is not None]
        for _, j in failed:
            self.count(j.failure)
        if failed:  # one line a batch: the count, the kinds, and the first failure's reply or error
            kinds = dict(Counter(j.failure for _, j in failed))
            label, first = failed[0]
            log.warning(
                "judge %r: %d of %d failed %s; first, %s: %s", self.settings.name, len(failed), len(out), kinds,
                label, first.reply[:300],
            )  # fmt: skip
        return out

    async def ascore(
        self, conversation: list[dict[str, Any]], label: str = "rubric", env_name: str = "rubric"
    ) -> float:
        """One conversation's judge reward, for a reward function of an environment's own rubric
        (`await JUDGE.ascore([m.model_dump() for m in trace.messages])`): asked on a worker thread, so the
        rubric's other rewards run on meanwhile; cached, counted and logged as the recipe's judges are;
        the failure policy applies ("stop" and "retry" raise naming `label`, "drop_group" gives 0: one
        reward function cannot drop its group, the recipe's `judge` can)."""
        judged = await asyncio.to_thread(self.judge, [conversation], [label])
        rewards, _ = self.settle(judged, [label], env_name)
        return rewards[0]

    def shown(self, conversation: list[dict[str, Any]]) -> str:
        """What the judge is shown: the rendered prompt, or the conversation itself (classifier)."""
        if self.settings.kind == "classifier":
            return json_dumps(conversation)
        return self.settings.format.render(conversation, self.settings.rubric)

    def _ask(self, conversations: list, shown: list[str], keys: list[str], use_cache: bool = False) -> list[Judged]:
        replies: dict[int, str] = {}
        if use_cache:
            replies = {i: r for i, k in enumerate(keys) if (r := self.cache.get(k)) is not None}
            self.count("cached", len(replies))
        todo = [i for i in range(len(keys)) if i not in replies]
        self.count("requests", len(todo))
        answers = self._answers([conversations[i] for i in todo], [shown[i] for i in todo])
        out: dict[int, Judged] = {}
        for i, answer in zip(todo, answers):
            if answer.text is None:
                out[i] = Judged(None, answer.failure, answer.detail)
                continue
            self.cache.put(keys[i], answer.text)
            replies[i] = answer.text
        for i, text in replies.items():
            out[i] = self.read(text)
        return [out[i] for i in range(len(keys))]

    def _answers(self, conversations: list, shown: list[str]) -> list[JudgeReply]:
        if not shown:
            return []
        if self.settings.kind == "classifier":
            return self.backend.judge_conversations(conversations)
        return self.backend.ask(shown)

    def read(self, reply: str) -> Judged:
        """The reward a reply gives, or its failure."""
        if self.settings.kind == "classifier":
            score = float(reply)
            return Judged(score, None, reply) if math.isfinite(score) else Judged(None, "nonfinite", reply)
        try:
            return Judged(self.settings.format.parse(reply), None, reply)
        except ParseFailure as e:
            return Judged(None, "parse", str(e))

    def settle(self, judged: list[Judged], labels: list[str], env_name: str) -> tuple[list[float], bool]:
        """The rewards after the failure policy, and whether the group is dropped; "stop" (and "retry"
        past its rounds) raises RunDataError naming the first failure."""
        failed = [(label, j) for label, j in zip(labels, judged) if j.failure is not None]
        policy = self.settings.on_failure
        if failed and policy in ("stop", "retry"):
            label, j = failed[0]
            raise RunDataError(
                f"environment {env_name!r} {label}: judge {self.settings.name!r} failed ({j.failure}: "
                f"{j.reply[:300]}); {len(failed)} of {len(judged)} in the batch failed. judge.on_failure is "
                f"{policy!r}; set it to 'score' or 'drop_group' to train on, or fix the judge"
            )
        if failed and policy == "drop_group":
            self.count("dropped_groups")
            return [0.0] * len(judged), True
        self.count("scored_as_value", len(failed))
        return [self.settings.failure_score if j.score is None else j.score for j in judged], False


def json_dumps(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, ensure_ascii=False)
