"""Numbers of a sweep report: per-run metric series, variants (runs equal but for seeds), final values with CIs.

Final value of a run: the mean of a metric over its last k logged steps. Final value of a variant: the
mean of its runs' final values, with a 95% bootstrap CI from a two-level resample: seeds (runs) with
replacement, then the last-k steps within each drawn run. With one seed this is the step-to-step spread
only, with several seeds the seed-to-seed spread dominates, which is the one a reader should trust.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from grpokit.sweep.spec import is_seed_key


@dataclass
class RunMetrics:
    """The metrics.csv of one run: metric -> {step: value} (empty cells skipped)."""

    run_id: str
    series: dict[str, dict[int, float]]


def read_metrics(run_id: str, path: Path) -> RunMetrics:
    series: dict[str, dict[int, float]] = {}
    if path.is_file():
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if not row.get("step"):
                    continue
                step = int(float(row["step"]))
                for key, value in row.items():
                    if key != "step" and value not in ("", None) and math.isfinite(number := float(value)):
                        series.setdefault(key, {})[step] = number
    return RunMetrics(run_id, series)


def variant_label(run: dict) -> str:
    """What a run sets, seeds left out: runs with the same label are seeds of one variant."""
    parts = [Path(o).stem for o in run.get("overlays", [])]
    parts += [f"{k}={v}" for k, v in run["overrides"].items() if not is_seed_key(k)]
    return ", ".join(parts) or "base"


def curve(runs: list[RunMetrics], metric: str) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray]:
    """Steps logged by any seed, and per step the mean, min and max over the seeds that logged it."""
    steps = sorted({s for r in runs for s in r.series.get(metric, {})})
    values = [[r.series[metric][s] for r in runs if s in r.series.get(metric, {})] for s in steps]
    return (
        steps,
        np.array([np.mean(v) for v in values]),
        np.array([np.min(v) for v in values]),
        np.array([np.max(v) for v in values]),
    )


def last_k(run: RunMetrics, metric: str, k: int) -> list[float]:
    series = run.series.get(metric, {})
    return [series[s] for s in sorted(series)[-k:]]


def final_value(
    runs: list[RunMetrics], metric: str, k: int, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float, int] | None:
    """(mean, CI low, CI high, seeds) of a variant's final metric; None when no run logged it."""
    tails = [np.array(t) for r in runs if (t := last_k(r, metric, k))]
    if not tails:
        return None
    mean = float(np.mean([t.mean() for t in tails]))
    rng = np.random.default_rng(seed)
    lengths_S = np.array([len(t) for t in tails])  # S seeds, each with up to K = k steps
    values_SK = np.zeros((len(tails), lengths_S.max()))
    for j, t in enumerate(tails):
        values_SK[j, : len(t)] = t
    picked_BS = rng.integers(len(tails), size=(resamples, len(tails)))  # B resamples of S seeds
    n_BS = lengths_S[picked_BS]
    steps_BSK = (rng.random((*picked_BS.shape, values_SK.shape[1])) * n_BS[..., None]).astype(int)
    valid_BSK = np.arange(values_SK.shape[1]) < n_BS[..., None]
    draws = ((values_SK[picked_BS[..., None], steps_BSK] * valid_BSK).sum(-1) / n_BS).mean(-1)
    low, high = np.percentile(draws, [2.5, 97.5])
    return mean, float(low), float(high), len(tails)


REPLICATE_FINGERPRINT = ("reward", "seq_len")  # what the rollouts were: equal at every step = the same rollouts


def identical_replicates(runs: list[RunMetrics]) -> list[tuple[str, str]]:
    """Pairs of runs of one variant whose rollouts were the same: equal mean reward and mean completion
    length at every logged step. Such "seeds" share every random choice (a seed axis that does not reach
    the data and sampling seeds), so a CI over them measures nothing."""

    def fingerprint(run: RunMetrics) -> tuple:
        return tuple(tuple(sorted(run.series.get(m, {}).items())) for m in REPLICATE_FINGERPRINT)

    pairs, seen = [], {}
    for run in runs:
        key = fingerprint(run)
        if not any(key):
            continue
        if key in seen:
            pairs.append((seen[key], run.run_id))
        else:
            seen[key] = run.run_id
    return pairs
