"""The judge's prompt and the reading of its reply.

A judge is shown the whole conversation (every message, tool results included, role by role) and the
rubric, and asked to end its reply with one marked line: `Score: N` (a number in the recipe's range) or
`Verdict: WORD` (one of the recipe's verdict words). The marker makes the parse strict: a reply that
never says it, says a number outside the range or a word that is not a verdict is *garbage* (a
ParseFailure with the reason), never a guessed 0, so the run's failure policy decides what it counts
for (grpokit.judges.reward). The last marked line wins: a judge that reasons "Score: 3? no..." and then
concludes "Score: 7" is read as 7.

The template is plain text with three fields, `{rubric}`, `{conversation}` and `{instructions}`,
replaced in one pass (not by str.format, so a template or a conversation holding braces, as code does,
renders as written, and a rubric that says `{conversation}` is not filled in). The rendering is pinned
by golden files (tests/judges/golden/).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TEMPLATE = """You are grading the last assistant reply of a conversation against a rubric.

Rubric:
{rubric}

Conversation:
{conversation}

{instructions}"""

SCORE_LINE = re.compile(r"score\s*[:=]\s*\**\s*([-+]?\d+(?:\.\d+)?)", re.IGNORECASE)
FIELD = re.compile(r"\{(rubric|conversation|instructions)\}")  # the template's fields, replaced in one pass
VERDICT_LINE = re.compile(r"verdict\s*[:=]\s*\**\s*([A-Za-z_-]+)", re.IGNORECASE)


class ParseFailure(ValueError):
    """A judge reply that gives no score: why, for the log and the failure count."""


@dataclass
class JudgeFormat:
    """What the judge is asked for and how its reply is read.

    Args:
        parser: "score" (a number in `score_range`, scaled to [0, 1]) or "verdict" (a word of `verdicts`,
            worth its value).
        score_range: the lowest and highest score the judge may give; the reward is (score - low) /
            (high - low), so every judge's reward is in [0, 1] before its weight.
        verdicts: verdict word (matched without regard to case) -> reward.
        template: the prompt, with `{rubric}`, `{conversation}` and `{instructions}`; null = DEFAULT_TEMPLATE.
    """

    parser: str = "score"
    score_range: tuple[float, float] = (0.0, 10.0)
    verdicts: dict[str, float] = field(default_factory=lambda: {"yes": 1.0, "no": 0.0})
    template: str | None = None

    def __post_init__(self) -> None:
        if self.parser not in ("score", "verdict"):
            raise ValueError(f"judge.parser must be 'score' or 'verdict', got {self.parser!r}")
        low, high = (float(x) for x in self.score_range)
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"judge.score_range must be two finite numbers, low < high, got {self.score_range!r}")
        self.score_range = (low, high)
        self.verdicts = {str(k).lower(): float(v) for k, v in self.verdicts.items()}
        if self.parser == "verdict" and not self.verdicts:
            raise ValueError("judge.verdicts must name at least one verdict word (word: reward)")
        if self.template is not None and "{conversation}" not in self.template:
            raise ValueError("judge.template must contain {conversation}: the judge has to see what it grades")

    def instructions(self) -> str:
        """The closing request: how the reply must end, so that `parse` can read it."""
        if self.parser == "score":
            low, high = (f"{x:g}" for x in self.score_range)
            return f"Explain briefly, then end with a line `Score: N`, N a number from {low} to {high}."
        words = ", ".join(self.verdicts)
        return f"Explain briefly, then end with a line `Verdict: X`, X one of: {words}."

    def render(self, conversation: list[dict[str, Any]], rubric: str) -> str:
        """The judge's prompt for `conversation` (role/content messages, as verifiers' trace lists them)."""
        values = {
            "rubric": rubric.strip(),
            "instructions": self.instructions(),
            "conversation": render_conversation(conversation),
        }
        return FIELD.sub(lambda m: values[m.group(1)], self.template or DEFAULT_TEMPLATE)

    def parse(self, reply: str) -> float:
        """The reward in the reply (see the module docstring); ParseFailure when there is none."""
        if self.parser == "score":
            return self._score(reply)
        found = VERDICT_LINE.findall(reply)
        word = found[-1].lower() if found else reply.strip().strip(".!*`'\"").lower()
        if word not in self.verdicts:
            raise ParseFailure(f"no `Verdict: X` with X one of {list(self.verdicts)} in the reply {reply!r:.200}")
        return self.verdicts[word]

    def _score(self, reply: str) -> float:
        found = SCORE_LINE.findall(reply)
        if not found:
            bare = reply.strip().rstrip(".")
            if not re.fullmatch(r"[-+]?\d+(?:\.\d+)?", bare):
                raise ParseFailure(f"no `Score: N` line in the reply {reply!r:.200}")
            found = [bare]
        score, (low, high) = float(found[-1]), self.score_range
        if not low <= score <= high:
            raise ParseFailure(f"score {score:g} is outside {low:g}..{high:g} in the reply {reply!r:.200}")
        return (score - low) / (high - low)


def render_conversation(conversation: list[dict[str, Any]]) -> str:
    """Each message as a `[role]` line and its text, a blank line between messages; an assistant's tool
    calls follow its text as JSON, a tool result names its call. Non-text content parts are shown as JSON."""
    blocks = []
    for message in conversation:
        role = message.get("role", "?")
        header = f"[{role}]" if role != "tool" else f"[tool {message.get('tool_call_id', '')}]".replace(" ]", "]")
        content = message.get("content")
        text = content if isinstance(content, str) else "" if content is None else json.dumps(content)
        if message.get("tool_calls"):
            text += ("\n" if text else "") + "tool calls: " + json.dumps(message["tool_calls"], sort_keys=True)
        blocks.append(f"{header}\n{text}")
    return "\n\n".join(blocks)
