"""countdown: solvable generated puzzles and safe expression scoring through Environment.score."""

import os
import re
from collections import Counter

import pytest

from grpokit.environments.environment import Environment, EnvSpec, Example
from grpokit.envs.countdown import CountdownData, CountdownTask, CountdownTaskConfig, evaluate


def load(**args) -> Environment:
    return Environment(EnvSpec(id="countdown", args={"num_tasks": 50, **args}))


def example(numbers: list[int], target: int, format_score: float = 0.1) -> Example:
    data = CountdownData(prompt="", numbers=numbers, target=target, solution="")
    return Example(0, [], CountdownTask(data, CountdownTaskConfig(format_score=format_score)))


def test_puzzles_are_solvable():
    env = load(max_target=100)
    assert len(env.examples) == 50
    for ex in env.examples:
        d = ex.task.data
        assert 3 <= len(d.numbers) <= 4 and all(1 <= n <= 99 for n in d.numbers)
        assert 1 <= d.target <= 100 and d.target not in d.numbers
        assert evaluate(d.solution, d.numbers) == d.target
        assert Counter(map(int, re.findall(r"\d+", d.solution))) == Counter(d.numbers)  # each number exactly once
        system, user = ex.messages
        assert system["role"] == "system" and user["role"] == "user"
        assert str(d.numbers) in user["content"] and f"equals {d.target}." in user["content"]


def test_same_seed_same_puzzles():
    a, b, c = load(seed=1), load(seed=1), load(seed=2)
    assert [ex.task.data for ex in a.examples] == [ex.task.data for ex in b.examples]
    assert [ex.task.data for ex in a.examples] != [ex.task.data for ex in c.examples]


def test_generated_solution_scores_one():
    env = load(num_tasks=5)
    scores = env.score(
        env.examples, [f"<think>easy</think>\n<answer>{ex.task.data.solution}</answer>" for ex in env.examples]
    )
    assert scores == [(1.0, {"solved": 1.0})] * 5


@pytest.mark.parametrize(
    "reply, reward",
    [
        ("<answer>4 + 7</answer>", 1.0),
        ("<answer>4 * 4 - 7</answer>", 0.1),  # well formed, 9 != 11
        ("I try 4 + 4 + 7 = 15.\nSo the answer:\n4 + 7", 1.0),  # no tags: the last line
        ("<answer> 44 / 4 = 11 </answer>", 0.0),  # 44 is not offered
        ("<answer>7 + 4 = 11</answer>", 1.0),  # "= target" is dropped
        ("<answer>4 * 4 - 7 + 2</answer>", 0.0),  # 2 is not offered
        ("<answer>(7 - 4) * 4 - 4 / 4</answer>", 0.0),  # 4 three times, only offered twice
        ("<answer>4 + 4 + 7</answer>", 0.1),  # well formed, 15 != 11
        ("<answer>7 / 4 + 4</answer>", 0.1),  # 23/4, exact fractions
        ("<answer>7 / (4 - 4)</answer>", 0.0),  # division by zero
        ("<answer>7 ** 4</answer>", 0.0),  # power is not allowed
        ("<answer>7 // 4</answer>", 0.0),  # floor division is not allowed
        ("<answer>-4 + 7 + 4 + 4</answer>", 0.0),  # unary minus is not allowed
        ("<answer>4.0 + 7</answer>", 0.0),  # float literals are not offered numbers
        ("<answer>(4)(7)</answer>", 0.0),  # a call
        ("<answer></answer>", 0.0),
        ("<answer>7</answer>", 0.0),  # a bare offered number: no format credit
        ("So the answer is\n4", 0.0),
        ("<answer>(7)</answer>", 0.0),
        ("I don't know", 0.0),
        ("", 0.0),
    ],
)
def test_scores(reply, reward):
    env = load(num_tasks=1)
    [(got, metrics)] = env.score([example([4, 4, 7], 11)], [reply])
    assert got == reward
    assert metrics == {"solved": float(reward == 1.0)}


def test_injected_code_is_never_run(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(os, "system", lambda cmd: calls.append(cmd))
    marker = tmp_path / "pwned"
    replies = [
        "<answer>__import__('os').system('x')</answer>",
        f"<answer>open({str(marker)!r}, 'w').write('x')</answer>",
        "__import__('os').system('x')",
        "<answer>4 + 7 + __import__('os').system('x')</answer>",
    ]
    env = load(num_tasks=1)
    scores = env.score([example([4, 4, 7], 11)] * len(replies), replies)
    assert [r for r, _ in scores] == [0.0] * len(replies)
    assert calls == [] and not marker.exists()


def test_format_score_is_configurable():
    env = load(num_tasks=2, task={"format_score": 0.0})
    assert env.examples[0].task.config.format_score == 0.0
    [(reward, _)] = env.score([example([4, 4, 7], 11, format_score=0.0)], ["<answer>4 + 4 + 7</answer>"])
    assert reward == 0.0


def test_long_or_deep_expressions_are_rejected():
    assert evaluate("(" * 150 + "4" + ")" * 150, [4]) is None
    assert evaluate(" + ".join(["4"] * 100), [4] * 100) is None


def test_bad_args_are_errors():
    with pytest.raises(ValueError, match="min_numbers"):
        load(min_numbers=4, max_numbers=3)
