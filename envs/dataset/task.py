"""The task of a question/answer row: its reward compares the reply's final answer with the row's answer.

Reward, chosen by `task.match`:
- "gsm8k": 1.0 when the reply's final answer equals the number after the answer's `####`, compared as
  numbers (envs/dataset/answers.py). The final answer is the number in the reply's last \\boxed{} (the
  format the gsm8k prompt asks for), else the first number after its last `####`, else, as a fallback,
  the reply's last number. So by default a bare number ("18") and a number ending prose ("so she has 18
  apples") score like "\\boxed{18}"; of several numbers the boxed one counts, else the one after `####`,
  else the last ("18, or maybe 20" is read as 20).
- "exact": 1.0 when the stripped reply equals the stripped answer.
- "math": 1.0 when math_verify finds the reply equivalent to the answer (envs/jsonl's `math_equal`).

The fallback is deliberate (a small model rarely boxes its answer at first; recipes/gsm8k.yaml learns
from it). Two settings make the format count:
- `task.format_weight` w mixes in a format reward: reward = (1 - w) * correct + w * formatted, where
  `formatted` is 1.0 when the reply states its answer in \\boxed{} or after `####` (with a number, for
  match gsm8k); w = 0 (the default) is a pure correctness reward.
- `task.require_format: true` scores a reply as correct only when it is formatted so: a bare number or
  one in prose then scores 0 (the rule verifiers#1028's users expected when the prompt requires a format).
  Not with match exact, which compares the whole reply.
Metrics: `correct` and `formatted`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import verifiers.v1 as vf
from pydantic import Field, model_validator

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
    require_format: bool = False

    @model_validator(mode="after")
    def _format_needs_a_final_answer(self) -> AnswerTaskConfig:
        """require_format with match exact would score every reply 0 (a boxed reply never equals the answer)."""
        if self.require_format and self.match == "exact":
            raise ValueError("task.require_format needs task.match gsm8k or math (exact compares the whole reply)")
        return self


class AnswerTask(vf.Task[AnswerData, vf.State, AnswerTaskConfig]):
    def parse_answer(self, reply: str) -> object:
        """The reply's answer as the match compares it, for `grpokit eval`'s majority vote: the number
        (gsm8k), the stripped reply (exact), or the stripped final \\boxed{} content (math; equivalent
        forms such as 1/2 and 0.5 then vote apart). None (no vote) for an unformatted reply when
        `require_format` is set, as it cannot be correct."""
        if self.config.require_format and not self.is_formatted(reply):
            return None
        if self.config.match == "gsm8k":
            return answers.reply_answer(reply)
        if self.config.match == "exact":
            return reply.strip() or None
        return (answers.last_boxed(reply) or "").strip() or None

    def is_formatted(self, reply: str) -> bool:
        """The reply states its final answer in \\boxed{} or after `####` (gsm8k: with a number there; math:
        any \\boxed{})."""
        if self.config.match == "math":
            return answers.last_boxed(reply) is not None or answers.formatted(reply)
        return answers.formatted(reply)

    def is_correct(self, trace: vf.Trace) -> bool:
        reply = trace.last_reply or ""
        if self.config.require_format and not self.is_formatted(reply):
            return False
        return MATCHES[self.config.match](reply, self.data.answer)

    @vf.reward(weight=1.0)
    async def answer(self, trace: vf.Trace) -> float:
        w = self.config.format_weight
        return (1.0 - w) * self.is_correct(trace) + w * self.is_formatted(trace.last_reply or "")

    @vf.metric
    async def correct(self, trace: vf.Trace) -> float:
        return float(self.is_correct(trace))

    @vf.metric
    async def formatted(self, trace: vf.Trace) -> float:
        return float(self.is_formatted(trace.last_reply or ""))
