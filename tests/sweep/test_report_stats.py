"""Report numbers by hand: variants ignore seeds, curves over seeds, final values and their bootstrap CI."""

import pytest

from grpokit.sweep.report import flatten, pick_metrics
from grpokit.sweep.report_stats import RunMetrics, curve, final_value, last_k, read_metrics, variant_label
from grpokit.sweep.spec import SweepError


def run(rid: str, **series) -> RunMetrics:
    return RunMetrics(rid, {k: dict(v) for k, v in series.items()})


def test_variant_label_leaves_seeds_out():
    assert (
        variant_label(
            {"overrides": {"model.loss": "GSPO", "seed_everything": 1, "data.sampling.seed": 2}, "overlays": []}
        )
        == "model.loss=GSPO"
    )
    assert variant_label({"overrides": {"seed_everything": 1}, "overlays": ["recipes/ablations/rloo.yaml"]}) == "rloo"
    assert variant_label({"overrides": {"seed_everything": 1}, "overlays": []}) == "base"


def test_curve_is_mean_min_max_over_the_seeds_that_logged_a_step():
    a, b = run("a", reward=[(0, 1.0), (1, 2.0)]), run("b", reward=[(0, 3.0), (2, 5.0)])
    steps, mean, low, high = curve([a, b], "reward")
    assert steps == [0, 1, 2]
    assert mean.tolist() == [2.0, 2.0, 5.0] and low.tolist() == [1.0, 2.0, 5.0] and high.tolist() == [3.0, 2.0, 5.0]


def test_last_k_follows_step_order():
    assert last_k(run("a", kl=[(3, 0.3), (0, 0.0), (2, 0.2), (1, 0.1)]), "kl", 2) == [0.2, 0.3]
    assert last_k(run("a"), "kl", 2) == []


def test_final_value_and_its_bootstrap_interval():
    # one seed, constant tail: no spread at all
    assert final_value([run("a", reward=[(0, 9.0), (1, 0.5), (2, 0.5)])], "reward", k=2) == (0.5, 0.5, 0.5, 1)
    # two constant seeds at 1 and 3: resampled seed pairs average to 1, 2 or 3 (p = 1/4, 1/2, 1/4)
    mean, low, high, seeds = final_value(
        [run("a", reward=[(0, 1.0), (1, 1.0)]), run("b", reward=[(0, 3.0), (1, 3.0)])], "reward", k=2
    )
    assert (mean, low, high, seeds) == (2.0, 1.0, 3.0, 2)
    # within-seed spread only: the CI of the mean of [0, 1] covers the mean and stays inside [0, 1]
    mean, low, high, _ = final_value([run("a", reward=[(s, float(s % 2)) for s in range(20)])], "reward", k=20)
    assert mean == 0.5 and 0.2 < low < 0.5 < high < 0.8
    assert final_value([run("a")], "reward", k=2) is None


def test_read_metrics_skips_empty_cells(tmp_path):
    (tmp_path / "metrics.csv").write_text(
        "eval/reward,reward,step\n0.5,0.1,0\n,0.2,1\n,nan,2\n"
    )  # nan: skipped, not plotted
    assert read_metrics("r", tmp_path / "metrics.csv").series == {"eval/reward": {0: 0.5}, "reward": {0: 0.1, 1: 0.2}}


def test_metric_choice_and_flattening():
    runs = [run("a", reward=[(0, 1.0)], kl=[(0, 0.0)], custom=[(0, 2.0)])]
    assert pick_metrics(None, runs) == ["reward", "kl"]
    assert pick_metrics(["custom"], runs) == ["custom"]
    with pytest.raises(SweepError, match=r"no run logged them; metrics.csv columns are \['custom', 'kl', 'reward'\]"):
        pick_metrics(["entropy"], runs)
    assert flatten(
        {"model": {"loss": {"class_path": "X", "init_args": {"a": 1}}, "lr": 0.1}, "tags": [1, 2], "empty": {}}
    ) == {"model.loss.class_path": "X", "model.loss.init_args.a": 1, "model.lr": 0.1, "tags": [1, 2], "empty": {}}
