"""pass@k, maj@n and bootstrap intervals on hand-computed float64 cases; the online eval's pass@k end to end."""

import json
import math
import re
from fractions import Fraction

import numpy as np
import pytest

from grpokit.evaluate.report import notes
from grpokit.evaluate.scoring import Problem, per_problem_values, summarise
from grpokit.main import main
from grpokit.orchestrator.eval_metrics import (
    bootstrap_ci,
    ladder,
    majority_correct,
    paired_difference,
    pass_at_k,
    pass_at_k_means,
)
from grpokit.testing import tiny_fit_argv


@pytest.mark.unit
@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (5, 2, 1, 2 / 5),  # pass@1 = c / n
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2) / C(5,2)
        (5, 2, 3, 1 - 1 / 10),  # 1 - C(3,3) / C(5,3)
        (5, 2, 4, 1.0),  # n - c = 3 < k: every 4 of the 5 hold a correct one
        (10, 3, 4, 1 - 35 / 210),  # 1 - C(7,4) / C(10,4)
        (5, 1, 5, 1.0),  # k = n: one correct sample among all of them
        (5, 0, 5, 0.0),  # k = n, all wrong
        (8, 0, 1, 0.0),  # all wrong
        (8, 0, 8, 0.0),
        (8, 8, 1, 1.0),  # all right
        (8, 8, 8, 1.0),
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-15)


@pytest.mark.unit
def test_pass_at_k_is_stable_where_the_binomials_overflow_a_float():
    n, c, k = 1200, 37, 600  # C(1200, 600) ~ 1e359: past float64
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)
    assert pass_at_k(200, 13, 100) == pytest.approx(
        float(1 - Fraction(math.comb(187, 100), math.comb(200, 100))), rel=1e-12
    )


@pytest.mark.unit
def test_pass_at_k_means_over_problems():
    rewards = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]
    means = pass_at_k_means(rewards, threshold=1.0)
    assert list(means) == [1, 2, 4]
    assert means[1] == pytest.approx((1 / 4 + 1 + 0) / 3, abs=1e-15)
    assert means[2] == pytest.approx((1 - 3 / 6 + 1 + 0) / 3, abs=1e-15)  # 1 - C(3,2)/C(4,2) for problem 0
    assert means[4] == pytest.approx(2 / 3, abs=1e-15)
    # the threshold decides what is correct: 0.9 >= 0.8
    assert pass_at_k_means([[0.9, 0.1]], threshold=0.8, ks=[1]) == {1: 0.5}


@pytest.mark.unit
def test_ladder():
    assert ladder(1) == [1] and ladder(2) == [1, 2] and ladder(8) == [1, 2, 4, 8] and ladder(6) == [1, 2, 4, 6]


@pytest.mark.unit
def test_k_larger_than_the_samples_is_an_error_naming_the_fix():
    with pytest.raises(ValueError, match=re.escape("pass@8 needs at least 8 samples per problem, got 4")):
        pass_at_k(4, 1, 8)


@pytest.mark.unit
def test_majority_vote():
    assert majority_correct([3, 5, 5, None], [1.0, 0.0, 0.0, 0.0], 1.0) == 0.0  # 5 wins, and it is wrong
    assert majority_correct([5, 3, 3, None], [0.0, 1.0, 1.0, 0.0], 1.0) == 1.0  # 3 wins, and it is right
    assert majority_correct([3, 3, 5, 5], [1.0, 1.0, 0.0, 0.0], 1.0) == 1.0  # a tie goes to the first seen (3)
    assert majority_correct([5, 5, 3, 3], [0.0, 0.0, 1.0, 1.0], 1.0) == 0.0
    assert majority_correct([None, None, 7], [0.0, 0.0, 1.0], 1.0) == 1.0  # no answer, no vote
    assert majority_correct([None, None], [1.0, 1.0], 1.0) == 0.0  # nothing to vote on


@pytest.mark.unit
def test_bootstrap_is_seeded_contains_the_mean_and_narrows_with_more_problems():
    rng = np.random.default_rng(0)
    few, many = rng.random(10), rng.random(1000)
    low, high = bootstrap_ci(few, seed=3)
    assert (low, high) == bootstrap_ci(few, seed=3)  # seeded: the same interval again
    assert bootstrap_ci(few, seed=4) != (low, high)
    assert low < few.mean() < high
    low_many, high_many = bootstrap_ci(many, seed=3)
    assert low_many < many.mean() < high_many
    assert high_many - low_many < (high - low) / 3  # ~ 1/sqrt(problems): 10x narrower for 100x the problems
    assert bootstrap_ci([0.5] * 7, seed=0) == (0.5, 0.5)  # no spread, no width


@pytest.mark.unit
def test_paired_difference():
    a = [0.0, 1.0, 0.5, 0.25]
    same = paired_difference(a, [x + 0.125 for x in a], seed=0)
    assert same == {"diff": 0.125, "ci_low": 0.125, "ci_high": 0.125}  # the same shift on every problem
    d = paired_difference([0, 0, 1, 1, 0, 1], [1, 0, 1, 1, 1, 1], seed=0)
    assert d["diff"] == pytest.approx(2 / 6) and d["ci_low"] <= d["diff"] <= d["ci_high"]
    with pytest.raises(ValueError, match="the same problems"):
        paired_difference([1.0], [1.0, 0.0], seed=0)


@pytest.mark.unit
def test_per_env_metrics_maj_only_where_answers_parse():
    problems = [
        Problem("math", 0, [1.0, 0.0, 1.0], answers=[4, 5, 4], greedy_reward=1.0, metrics={"correct": 2 / 3}),
        Problem("math", 1, [0.0, 0.0, 1.0], answers=[2, 2, 3], greedy_reward=0.0, metrics={"correct": 1 / 3}),
        Problem("text", 0, [0.5, 1.0, 0.0], answers=None),
    ]
    values = per_problem_values(problems, [1, 3], threshold=1.0)
    assert values["math"]["maj@3"] == [1.0, 0.0] and "maj@3" not in values["text"]
    assert values["math"]["pass@1"] == pytest.approx([2 / 3, 1 / 3]) and values["text"]["pass@3"] == [1.0]
    assert values["math"]["mean@3"] == pytest.approx([2 / 3, 1 / 3]) and values["math"]["greedy"] == [1.0, 0.0]
    summary = summarise(values, seed=0, resamples=200, level=0.9)
    assert summary["math"]["problems"] == 2 and summary["math"]["metrics"]["env/correct"]["mean"] == pytest.approx(0.5)
    assert notes({"m": summary}, 3) == [
        "text: no maj@3: its tasks have no parse_answer(reply) method, so answers cannot be compared"
    ]


def test_online_eval_logs_pass_at_k(tmp_path, tiny_model):
    argv = tiny_fit_argv(
        tmp_path, tiny_model, "r", "--trainer.max_steps", "1", "--data.max_async_level", "0", "--ckpt.interval", "0",
        "--data.eval.num_examples", "3", "--data.eval.rollouts_per_example", "4", "--data.eval.temperature", "1.0",
    )  # fmt: skip
    assert main(argv) == 0
    (row,) = [json.loads(line) for line in open(tmp_path / "r" / "eval.jsonl")]
    assert 0.0 <= row["eval/pass@1"] <= row["eval/pass@2"] <= row["eval/pass@4"] <= 1.0
    assert "eval/pass@8" not in row
