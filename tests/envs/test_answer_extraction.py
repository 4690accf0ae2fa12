"""What each shipped environment that reads an answer scores, through its real reward (Environment.score):
the format its prompt asks for, a bare number, a number inside prose, and several numbers. The table in
docs/environments.md ("What the built-in answer checkers score") states these cases; verifiers#1028 was
an extractor that let a bare number score where a format was required, so here each choice is pinned."""

import pytest

from grpokit.environments.environment import Environment, EnvSpec
from grpokit.envs.dataset.answers import reference_answer
from grpokit.envs.guess_number import parse_guess
from tests.envs.test_countdown import example
from tests.support import play


def rewards(env: Environment, ex, replies: list[str]) -> list[float]:
    return [reward for reward, _ in env.score([ex] * len(replies), replies)]


ARITHMETIC = [  # (reply, reward) for the example's answer n
    ("\\boxed{{{n}}}", 1.0),  # the format the prompt offers
    ("{n}", 1.0),  # a bare number: the prompt's "alone"
    ("So Tom has {n} apples.", 1.0),  # a number ending prose: the fallback
    ("{n} apples in 2 bags", 0.0),  # ... which reads the last number
    ("{m}, or rather {n}", 1.0),  # several numbers: the last counts
    ("{n}, or rather {m}", 0.0),
    ("\\boxed{{{n}}}, check: {m}", 1.0),  # a \boxed{} wins over the numbers after it
    ("\\boxed{{x}} so {n}", 0.0),  # a \boxed{} without a number is no answer
]


@pytest.mark.parametrize(("reply", "reward"), ARITHMETIC)
def test_arithmetic(reply, reward):
    env = Environment(EnvSpec(id="arithmetic", args={"num_tasks": 1}))
    n = env.examples[0].task.data.answer
    assert rewards(env, env.examples[0], [reply.format(n=n, m=n + 1)]) == [reward]


GSM8K = [  # (reply, reward by default, reward with task.require_format)
    ("\\boxed{{{n}}}", 1.0, 1.0),  # the format the prompt asks for
    ("#### {n}", 1.0, 1.0),  # GSM8K's own marker
    ("{n}", 1.0, 0.0),  # a bare number: the fallback, unless the format is required
    ("So she has {n} apples.", 1.0, 0.0),  # a number ending prose: the same
    ("{m}, or maybe {n}", 1.0, 0.0),  # several numbers: the last counts
    ("{n}, or maybe {m}", 0.0, 0.0),
    ("\\boxed{{{n}}}, not {m}", 1.0, 1.0),  # the boxed one wins
    ("#### {n} (not {m})", 1.0, 1.0),  # the first after the last `####`
    ("\\boxed{{{m}}} though {n}", 0.0, 0.0),
]


@pytest.mark.parametrize(("reply", "default", "required"), GSM8K)
def test_gsm8k_and_dataset_answers(reply, default, required):
    plain = Environment(EnvSpec(id="gsm8k", args={"split": "eval", "num_tasks": 1}))
    strict = Environment(EnvSpec(id="gsm8k", args={"split": "eval", "num_tasks": 1, "task": {"require_format": True}}))
    n = int(reference_answer(plain.examples[0].task.data.answer))
    text = reply.format(n=n, m=n + 1)
    assert rewards(plain, plain.examples[0], [text]) == [default]
    assert rewards(strict, strict.examples[0], [text]) == [required]
    voted = strict.examples[0].task.parse_answer(text)  # grpokit eval's majority vote agrees with the reward
    assert (voted is None) == ("\\boxed" not in text and "####" not in text)  # unformatted: no vote


def test_require_format_metrics_and_refusal():
    strict = Environment(EnvSpec(id="gsm8k", args={"split": "eval", "num_tasks": 1, "task": {"require_format": True}}))
    n = int(reference_answer(strict.examples[0].task.data.answer))
    [(_, bare), (_, boxed)] = strict.score([strict.examples[0]] * 2, [str(n), f"\\boxed{{{n}}}"])
    assert (bare["correct"], bare["formatted"], boxed["correct"], boxed["formatted"]) == (0.0, 0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="require_format needs task.match gsm8k or math"):
        Environment(EnvSpec(id="gsm8k", args={"task": {"require_format": True, "match": "exact"}}))


COUNTDOWN = [  # numbers [4, 4, 7], target 11
    ("<answer>4 + 7</answer>", 1.0),  # the format the prompt asks for
    ("11", 0.0),  # a bare number, the target itself: no answer
    ("<answer>11</answer>", 0.0),  # ... in tags too, and no format credit
    ("I get 4 + 7 = 11.", 0.0),  # an expression inside prose, untagged
    ("I get <answer>4 + 7</answer>.", 1.0),  # tagged inside prose
    ("I try this:\n4 + 7 = 11", 1.0),  # alone on the last line
    ("<answer>4 * 4</answer> no: <answer>4 + 7</answer>", 1.0),  # several: the last tagged one
    ("<answer>4 + 7</answer> no: <answer>4 * 4</answer>", 0.1),  # well formed, 16 != 11
]


@pytest.mark.parametrize(("reply", "reward"), COUNTDOWN)
def test_countdown(reply, reward):
    env = Environment(EnvSpec(id="countdown", args={"num_tasks": 1}))
    assert rewards(env, example([4, 4, 7], 11), [reply]) == [reward]


CALCULATOR = [  # the final reply, for the example's answer n of question "a op b"
    ("{n}", 1.0),  # "the number only"
    ("{q} is {n:,}.", 1.0),  # a number ending prose, with a thousands comma
    ("{q} = {n}", 1.0),  # several numbers: the last counts
    ("{n}, no, {m}", 0.0),
    ("{n}.0", 1.0),  # a whole value
    ("1.{n}", 0.0),  # a decimal is one number: its digits after the point are not n
]


@pytest.mark.parametrize(("reply", "reward"), CALCULATOR)
def test_calculator(reply, reward):
    env = Environment(EnvSpec(id="calculator", args={"num_tasks": 1}))
    ex = env.examples[0]
    n, q = ex.task.data.answer, ex.messages[-1]["content"].removeprefix("What is ").rstrip("?")
    text = reply.format(n=n, m=n + 1, q=q)
    [(got, _)] = env.score_conversations([ex], [play(env, ex, [text]).messages])
    assert round(got, 6) == reward


@pytest.mark.parametrize(("reply", "guess"), [("5", 5), ("I guess 5.", 5), ("5 or 6", 5), ("no idea", None)])
def test_guess_number_reads_the_first_whole_number(reply, guess):
    assert parse_guess(reply) == guess
