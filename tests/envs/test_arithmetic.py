"""arithmetic: generated word problems, their answers, and exact-integer scoring through Environment.score."""

import re

import pytest

from grpokit.environments.environment import Environment, EnvSpec
from grpokit.envs.arithmetic import parse_answer


def load(**args) -> Environment:
    return Environment(EnvSpec(id="arithmetic", args={"num_tasks": 50, **args}))


def solve(question: str) -> tuple[int, int]:
    """Re-derive (answer, steps) from the problem text, independently of the generator."""
    groups = re.match(r"\w+ has (\d+) \w+ of (\d+) \w+ each\.", question)
    plain = re.match(r"\w+ has (\d+) \w+\.", question)
    total, steps = (int(groups[1]) * int(groups[2]), 1) if groups else (int(plain[1]), 0)
    for sentence in re.findall(r"Then [^.]*\.", question):
        if m := re.search(r"buys (\d+) more", sentence):
            total += int(m[1])
        elif m := re.search(r"gives away (\d+)", sentence):
            total -= int(m[1])
        elif m := re.search(r"into (\d+) piles", sentence):
            assert total % int(m[1]) == 0
            total //= int(m[1])
        else:
            total *= {"doubles.": 2, "triples.": 3}[sentence.split()[-1]]
        assert total > 0
        steps += 1
    return total, steps


def test_examples_prompts_and_answers():
    env = load(min_steps=2, max_steps=3, max_number=15)
    assert len(env.examples) == 50
    for ex in env.examples:
        system, user = ex.messages
        assert system["role"] == "system" and "integer" in system["content"]
        assert user["role"] == "user" and user["content"].endswith("have now?")
        answer, steps = solve(user["content"])
        assert answer == ex.task.data.answer
        assert 2 <= steps <= 3


def test_same_seed_same_problems():
    a, b, c = load(seed=3), load(seed=3), load(seed=4)
    assert [ex.messages for ex in a.examples] == [ex.messages for ex in b.examples]
    assert [ex.messages for ex in a.examples] != [ex.messages for ex in c.examples]


def test_scores_correct_wrong_and_malformed_replies():
    env = load(num_tasks=1)
    ex = env.examples[0]
    n = ex.task.data.answer
    replies = [
        str(n),
        f"First 3 * 4 = 12, so \\boxed{{{n}}}",
        f"The answer is {n}.",
        f"{n:,}.0",
        str(n + 1),
        f"\\boxed{{{n + 1}}} (not {n})",
        "I don't know",
        f"{n}.5",
        "",
    ]
    scores = env.score([ex] * len(replies), replies)
    assert [r for r, _ in scores] == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert [m["parsed"] for _, m in scores] == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("42", 42),
        ("-3", -3),
        ("1,234 apples", 1234),
        ("7 then 8", 8),
        ("\\boxed{5} and later 9", 5),
        ("\\boxed{x = 12}", 12),
        ("12.0", 12),
        ("12.5", None),
        ("twelve", None),
    ],
)
def test_parse_answer(reply, expected):
    assert parse_answer(reply) == expected


def test_bad_args_are_errors():
    with pytest.raises(ValueError, match="min_steps"):
        load(min_steps=3, max_steps=2)
    with pytest.raises(ValueError, match="max_number"):
        load(max_number=1)
