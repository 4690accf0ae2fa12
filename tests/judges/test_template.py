"""The judge's prompt renders the conversation exactly (a golden file), and its reply is read strictly:
a score in the range, a verdict word, or garbage (grpokit.judges.template)."""

from pathlib import Path

import pytest

from grpokit.judges.template import JudgeFormat, ParseFailure

GOLDEN = Path(__file__).parent / "golden"
RUBRIC = "The final answer is the sum of the numbers, and the reply shows the {tool} call it used.\n"
CONVERSATION = [
    {"role": "system", "content": "You add numbers. Use the `add` tool."},
    {"role": "user", "content": 'What is 2 + 40? Reply as {"answer": N}.'},
    {
        "role": "assistant",
        "content": "Let me add them.",
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 40}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": "42"},
    {"role": "assistant", "content": '{"answer": 42}\n\n  (indented line kept)'},
]


@pytest.mark.parametrize("parser", ["score", "verdict"])
def test_the_prompt_renders_the_conversation_exactly(parser):
    rendered = JudgeFormat(parser=parser, score_range=(1, 10)).render(CONVERSATION, RUBRIC)
    assert rendered == (GOLDEN / f"judge_prompt_{parser}.txt").read_text()


def test_a_custom_template_keeps_braces_and_needs_the_conversation():
    fmt = JudgeFormat(template="Grade {rubric} with {braces} kept:\n{conversation}")
    assert fmt.render([{"role": "user", "content": "{x}"}], "R") == "Grade R with {braces} kept:\n[user]\n{x}"
    with pytest.raises(ValueError, match="conversation"):
        JudgeFormat(template="no conversation here")


@pytest.mark.parametrize(
    ("reply", "reward"),
    [
        ("Score: 7", 0.7),
        ("The reply is good.\nscore = 10", 1.0),
        ("First I thought Score: 3, but on reflection...\n**Score:** 4.5", 0.45),
        ("0", 0.0),
        ("  8.  ", 0.8),
    ],
)
def test_scores_are_read_from_the_last_marked_line_and_scaled(reply, reward):
    assert JudgeFormat(score_range=(0, 10)).parse(reply) == pytest.approx(reward)


@pytest.mark.parametrize(
    "reply", ["", "I cannot grade this.", "Score: 11", "Score: -1", "The score is high", "7 out of 10", "Score: seven"]
)
def test_garbage_and_out_of_range_scores_are_parse_failures(reply):
    with pytest.raises(ParseFailure):
        JudgeFormat(score_range=(0, 10)).parse(reply)


def test_verdicts():
    fmt = JudgeFormat(parser="verdict", verdicts={"Correct": 1, "Incorrect": 0, "partial": 0.5})
    assert fmt.parse("The steps check out.\nVerdict: CORRECT") == 1.0
    assert fmt.parse("verdict: partial") == 0.5
    assert fmt.parse("Incorrect.") == 0.0  # a bare verdict word is the whole reply
    for garbage in ("Verdict: maybe", "It is correct or incorrect", "", "Score: 10"):
        with pytest.raises(ParseFailure):
            fmt.parse(garbage)


def test_bad_formats_are_refused():
    with pytest.raises(ValueError, match="score_range"):
        JudgeFormat(score_range=(5, 5))
    with pytest.raises(ValueError, match="parser"):
        JudgeFormat(parser="likert")
