"""GSM8K-style answer extraction on hand-written replies: \\boxed{} (nested braces), ####, last number."""

from fractions import Fraction

import pytest

from grpokit.envs.dataset.answers import formatted, last_boxed, reference_answer, reply_answer, same_number


@pytest.mark.parametrize(
    "answer,expected",
    [
        ("Tom has 3 * 4 = 12 apples.\n#### 12", 12),
        ("The total is 1,200 + 34 = 1,234 dollars.\n#### 1,234", 1234),
        ("She owes 5 - 8 = -3.\n#### -3", -3),
        ("Half of 5 is 2.5\n#### 2.5", Fraction(5, 2)),
        ("#### 7 #### 8", 8),  # the last marker counts
        ("42", 42),  # no marker: the answer is the number
        ("-0.75", Fraction(-3, 4)),
        ("no number here", None),
        ("3/4", None),  # two numbers and no marker: no reference
        ("#### none", None),
    ],
)
def test_reference_answer(answer, expected):
    assert reference_answer(answer) == expected


@pytest.mark.parametrize(
    "reply,expected",
    [
        ("So she has \\boxed{12} apples.", 12),
        ("First \\boxed{3}, then correcting: \\boxed{5}", 5),  # the last \boxed
        ("\\boxed{\\frac{1}{2}}", Fraction(1, 2)),  # nested braces
        ("\\boxed{\\dfrac{3}{4}}", Fraction(3, 4)),
        ("\\boxed{3/4}", Fraction(3, 4)),
        ("\\boxed{1{,}000}", 1000),  # LaTeX thousands separator
        ("\\boxed{\\text{18 dollars}}", 18),
        ("\\boxed{x = 2 + 3 = 5}", 5),  # the last number inside the box
        ("The answer is \\boxed{-7}.", -7),
        ("\\boxed{2.50}", Fraction(5, 2)),
        ("12 + 30 = 42\n#### 42", 42),
        ("#### 1,234 apples", 1234),
        ("#### $18.00 in total", 18),
        ("He has 10 - 3 = 7 left, so 7 apples.", 7),  # the last number
        ("The total is 1,234,567.", 1234567),
        ("The change is 10-3", 3),  # a minus after a digit is an operator
        ("It is \u22124 degrees", -4),  # unicode minus
        ("\\boxed{} but then 9", 9),  # an empty box falls back
        ("\\boxed{12", 12),  # an unclosed box falls back to the last number
        ("I don't know.", None),
        ("", None),
    ],
)
def test_reply_answer(reply, expected):
    assert reply_answer(reply) == expected


def test_last_boxed_matches_braces():
    assert last_boxed("a \\boxed{\\frac{1}{2} + {3}} b") == "\\frac{1}{2} + {3}"
    assert last_boxed("\\boxed{open") is None
    assert last_boxed("no box") is None


def test_same_number_compares_values():
    assert same_number("\\boxed{18.0}", "... #### 18")
    assert same_number("so 1,200 in all", "#### 1200")
    assert not same_number("\\boxed{17}", "#### 18")
    assert not same_number("nothing", "#### 18")
    assert not same_number("18", "no number")


def test_formatted():
    assert formatted("\\boxed{4}") and formatted("so #### 4")
    assert not formatted("the answer is 4")
    assert not formatted("\\boxed{four}")
    assert not formatted("#### four")
