"""The task of a question/answer row: its reward compares the reply's final answer with the row's answer.

Reward, chosen by `task.match`:
- "gsm8k": 1.0 when the reply's final answer (\\boxed{}, else after `####`, else its last number) equals
  the number after the answer's `####`, compared as numbers (envs/dataset/answers.py).
- "exact": 1.0 when the stripped reply equals the stripped answer.
- "math": 1.0 when math_verify finds the reply equivalent to the answer (envs/jsonl's `math_equal`).

`task.format_weight` w mixes in a format reward: reward = (1 - w) * correct + w * formatted, where
`formatted` is 1.0 when the reply states its answer in \\boxed{} or after `####`; w = 0 (the default) is
a pure correctness reward. Metrics: `correct` and `formatted`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import verifiers.v1 as vf
from pydantic import Field

from grpokit.envs.dataset import answers
from grpokit.envs.jsonl import math_equal

Match = Literal["gsm8k", "exact", "math"]


def exact_equal(reply: str, answer: str) -> bool:
    return reply.strip() == answer.strip()


MATCHES: dict[str, Callable[[str, str], bool]] = {
    "gsm8k": answers.same_number,
    "exact": exact_equal,
    "math": math_equal,
}


def check_answer(match: Match, answer: str, where: str) -> None:
    """Refuse, at load, a reference the match could never be equal to (gsm8k: an answer with no number)."""
    if match == "gsm8k" and answers.reference_answer(answer) is None:
        raise ValueError(
            f"{where}: answer {answer!r:.200} has no number after '####' (nor is it one number), "
            "which task.match gsm8k needs; pick task.match exact or math, or another answer field"
        )


class AnswerData(vf.TaskData):
    answer: str


class AnswerTaskConfig(vf.TaskConfig):
    match: Match = "gsm8k"
    format_weight: float = Field(default=0.0, ge=0.0, le=1.0)


class AnswerTask(vf.Task[AnswerData, vf.State, AnswerTaskConfig]):
    def parse_answer(self, reply: str) -> object:
        """The reply's answer as the match compares it, for `grpokit eval`'s majority vote: the number
        (gsm8k), the stripped reply (exact), or the stripped final \\boxed{} content (math; equivalent
        forms such as 1/2 and 0.5 then vote apart)."""
        if self.config.match == "gsm8k":
            return answers.reply_answer(reply)
        if self.config.match == "exact":
            return reply.strip() or None
        return (answers.last_boxed(reply) or "").strip() or None

    def is_correct(self, trace: vf.Trace) -> bool:
        return MATCHES[self.config.match](trace.last_reply or "", self.data.answer)

    @vf.reward(weight=1.0)
    async def answer(self, trace: vf.Trace) -> float:
        w = self.config.format_weight
        return (1.0 - w) * self.is_correct(trace) + w * answers.formatted(trace.last_reply or "")

    @vf.metric
    async def correct(self, trace: vf.Trace) -> float:
        return float(self.is_correct(trace))

    @vf.metric
    async def formatted(self, trace: vf.Trace) -> float:
        return float(answers.formatted(trace.last_reply or ""))
