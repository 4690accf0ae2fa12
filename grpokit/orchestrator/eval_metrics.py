"""Metrics of n samples per problem: pass@k, majority vote (maj@n), and bootstrap confidence intervals.

Shared by the online evaluation (grpokit.orchestrator.evaluation: `eval/pass@k` when
data.eval.rollouts_per_example > 1) and `grpokit eval` (grpokit.evaluate), so both report the same numbers.

A sample is *correct* when its reward >= a threshold (default 1.0: full reward).

- pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1): the chance that at
  least one of k samples, drawn without replacement from the n drawn, is correct, for a problem with c
  correct samples of n:
      pass@k = 1 - C(n - c, k) / C(n, k)
  (1 when n - c < k), averaged over problems. This is unbiased for the pass@k of k fresh samples, unlike
  1 - (1 - c/n)^k. The binomials overflow for large n, so it is computed as the product
      C(n - c, k) / C(n, k) = prod_{i = n - c + 1}^{n} (1 - k / i)
  (the paper's numpy form), in float64.
- maj@n: the problem counts as solved when the most common parsed answer among its n samples is correct
  (Wang et al. 2023, self-consistency). Answers come from the task's optional `parse_answer(reply)` method
  (see `parse_answers`); samples without an answer (None) do not vote, ties go to the answer seen first,
  and the majority answer is judged by the first sample that gave it (under a pure correctness reward
  every sample with the same answer has the same reward). Environments whose tasks have no
  `parse_answer` report no maj@n.
- Confidence intervals: percentile bootstrap over problems (Efron 1979): resample the problems with
  replacement `resamples` times (seeded), take the metric's mean each time, report the (1 - level) / 2
  and (1 + level) / 2 quantiles. A paired comparison of two models on the same problems bootstraps the
  per-problem differences (the same resampled problems for both models).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """pass@k of one problem with `c` correct samples out of `n` (Chen et al. 2021), in float64."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"pass@k needs 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {n}: draw more samples (k >= {k})")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def ladder(n: int) -> list[int]:
    """The k of pass@k to report for n samples: 1, 2, 4, ... below n, and n."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]


def correct_counts(rewards_PG: Sequence[Sequence[float]], threshold: float) -> list[int]:
    """Correct samples per problem (P problems x G samples): reward >= threshold."""
    return [sum(r >= threshold for r in rewards) for rewards in rewards_PG]


def pass_at_k_per_problem(rewards_PG: Sequence[Sequence[float]], k: int, threshold: float) -> list[float]:
    """Each problem's pass@k from its G samples' rewards."""
    return [pass_at_k(len(rewards), c, k) for rewards, c in zip(rewards_PG, correct_counts(rewards_PG, threshold))]


def pass_at_k_means(rewards_PG: Sequence[Sequence[float]], threshold: float, ks: Sequence[int] | None = None):
    """{k: pass@k averaged over problems} for each k (default: `ladder(G)`)."""
    n = min(len(r) for r in rewards_PG)
    return {k: float(np.mean(pass_at_k_per_problem(rewards_PG, k, threshold))) for k in ks or ladder(n)}


def majority_correct(answers: Sequence[Hashable | None], rewards: Sequence[float], threshold: float) -> float:
    """1.0 when the majority answer of one problem's samples is correct, else 0.0 (None answers do not
    vote; ties go to the answer seen first; judged by the first sample with that answer)."""
    counts: dict[Hashable, int] = {}
    for a in answers:
        if a is not None:
            counts[a] = counts.get(a, 0) + 1
    if not counts:
        return 0.0
    top = max(counts.values())
    winner = next(a for a in answers if a is not None and counts[a] == top)
    return float(rewards[answers.index(winner)] >= threshold)


def parse_answers(task, replies: Sequence[str]) -> list[Hashable | None] | None:
    """The task's parsed answer of each reply, from its optional method `parse_answer(reply) -> Hashable |
    None` (a value that compares equal for equal answers: a number, a normalised string); None when the
    task has no such method (then maj@n is not reported for its environment)."""
    method = getattr(task, "parse_answer", None)
    return None if method is None else [method(reply) for reply in replies]


def bootstrap_ci(values: Sequence[float], seed: int, resamples: int = 1000, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-problem `values` (problems resampled with
    replacement, `resamples` times, numpy's generator seeded with `seed`)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("a bootstrap interval needs at least one problem")
    index = np.random.default_rng(seed).integers(0, x.size, size=(resamples, x.size))
    means = x[index].mean(axis=1)
    return float(np.quantile(means, (1 - level) / 2)), float(np.quantile(means, (1 + level) / 2))


def paired_difference(
    a: Sequence[float], b: Sequence[float], seed: int, resamples: int = 1000, level: float = 0.95
) -> dict[str, float]:
    """mean(b - a) over the same problems, with the bootstrap interval of the paired differences."""
    if len(a) != len(b):
        raise ValueError(f"a paired comparison needs the same problems, got {len(a)} and {len(b)}")
    diff = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    low, high = bootstrap_ci(diff, seed, resamples, level)
    return {"diff": float(diff.mean()), "ci_low": low, "ci_high": high}
