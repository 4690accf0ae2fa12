"""Each built-in environment's `parse_answer` (what `grpokit eval`'s majority vote compares) is the parser
its reward uses: equal answers in different words vote together, a reply with no answer does not vote."""

from fractions import Fraction

import pytest

from grpokit.environments.environment import Environment, EnvSpec


def task(env_id: str, **args):
    return Environment(EnvSpec(id=env_id, args={"num_tasks": 3, **args})).examples[0].task


@pytest.mark.unit
def test_arithmetic_and_calculator_vote_with_the_final_integer():
    arithmetic = task("arithmetic")
    assert arithmetic.parse_answer("3 + 4 = 7, so \\boxed{7}") == arithmetic.parse_answer("The answer is 7.") == 7
    assert arithmetic.parse_answer("no idea") is None and arithmetic.parse_answer("\\boxed{2.5}") is None
    calculator = task("calculator")
    assert calculator.parse_answer("It is 1,204.") == 1204 and calculator.parse_answer("hmm") is None


@pytest.mark.unit
def test_gsm8k_votes_with_the_final_number():
    gsm8k = task("gsm8k")
    assert gsm8k.parse_answer("so #### 18") == gsm8k.parse_answer("\\boxed{18}") == Fraction(18)
    assert gsm8k.parse_answer("nothing") is None


@pytest.mark.unit
def test_countdown_votes_with_the_value_of_the_expression():
    countdown = task("countdown")
    a, b = countdown.data.numbers[:2]
    assert countdown.parse_answer(f"<answer>{a} + {b}</answer>") == countdown.parse_answer(f"{b} + {a}") == a + b
    assert countdown.parse_answer("<answer>banana</answer>") is None


@pytest.mark.unit
def test_reverse_text_votes_with_the_stripped_reply():
    reverse = task("reverse-text")
    assert reverse.parse_answer("  olleh \n") == reverse.parse_answer("olleh") == "olleh"
    assert reverse.parse_answer("   ") is None
