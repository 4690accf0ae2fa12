"""GSM8K-style final answers: the reference after `####`, the reply's from \\boxed{}, `####` or its last number.

A number is an optional minus sign, digits (commas allowed between groups of three: "1,234"), and an
optional decimal part; a minus sign right after a letter, digit or ")" is an operator, not a sign
("10-3" holds 10 and 3). Values are exact fractions, so "2.50", "2.5" and "5/2" (from \\frac{5}{2})
are equal, and "18.0" equals 18.

- Reference: the first number after the answer's last `####`, as in GSM8K ("... #### 1,200"); an
  answer without `####` must be one number ("42", "-0.5").
- Reply: in order, the last \\boxed{...} (braces may nest: "\\boxed{\\frac{1}{2}}", "\\boxed{1{,}000}"),
  read as a fraction when it holds \\frac{a}{b} or a bare "a/b", else as its last number; the first
  number after the last `####`; the last number of the reply. None when there is none.
"""

from __future__ import annotations

import re
from fractions import Fraction

NUMBER = re.compile(r"(?:(?<![\w)])-)?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")
FRAC = re.compile(r"\\[dt]?frac\{\s*(-?[\d.]+)\s*\}\{\s*(-?[\d.]+)\s*\}")  # \frac{3}{4}, \dfrac, \tfrac
SLASH = re.compile(r"\s*(-?\d+)\s*/\s*(\d+)\s*")  # a boxed "3/4"
BOXED = "\\boxed{"
MARKER = "####"


def to_number(text: str) -> Fraction:
    return Fraction(text.replace(",", ""))


def numbers(text: str) -> list[Fraction]:
    """Every number of `text`, in order."""
    return [to_number(m) for m in NUMBER.findall(text.replace("\u2212", "-").replace("{,}", ","))]


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...}, braces matched; None when there is none or it is unclosed."""
    start = text.rfind(BOXED)
    if start < 0:
        return None
    depth, begin = 1, start + len(BOXED)
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[begin:i]
    return None


def boxed_number(content: str) -> Fraction | None:
    """The value of a \\boxed{} content: a fraction (\\frac{a}{b} or a bare a/b), else its last number."""
    if frac := FRAC.search(content) or SLASH.fullmatch(content):
        numerator, denominator = to_number(frac[1]), to_number(frac[2])
        return numerator / denominator if denominator else None
    found = numbers(content)
    return found[-1] if found else None


def after_marker(text: str) -> Fraction | None:
    """The first number after the last `####`, or None when there is no `####` or no number after it."""
    if MARKER not in text:
        return None
    found = numbers(text.rsplit(MARKER, 1)[1])
    return found[0] if found else None


def reference_answer(answer: str) -> Fraction | None:
    """The reference number of a GSM8K answer: after its last `####`, else the answer's only number."""
    if MARKER in answer:
        return after_marker(answer)
    found = numbers(answer)
    return found[0] if len(found) == 1 else None


def reply_answer(reply: str) -> Fraction | None:
    """The reply's final answer: the last \\boxed{}, else after `####`, else its last number."""
    content = last_boxed(reply)
    if content is not None and (value := boxed_number(content)) is not None:
        return value
    if (value := after_marker(reply)) is not None:
        return value
    found = numbers(reply)
    return found[-1] if found else None


def formatted(reply: str) -> bool:
    """Whether the reply states a final answer in \\boxed{} or after `####` (not only as its last number)."""
    content = last_boxed(reply)
    return (content is not None and boxed_number(content) is not None) or after_marker(reply) is not None


def same_number(reply: str, answer: str) -> bool:
    """Whether the reply's final answer equals the reference number of `answer`."""
    value = reply_answer(reply)
    return value is not None and value == reference_answer(answer)
