"""The judge recipe (recipes/judge_exclaim.yaml, docs/judges.md): it parses, and a 2-step fit of it on
tiny models (the tests' tiny Llama as the policy, a random tiny classifier as the judge) runs: the reward
is the judge's score alone, metrics.csv has the judge's score spread and the rule check beside it, and
samples.jsonl carries each logged rollout's classifier score."""

import json
from pathlib import Path

import pytest
import yaml

from grpokit.judges import JudgeSettings
from grpokit.main import main
from tests.judges.helpers import judge_fit_argv
from tests.support import read_metrics

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "judge_exclaim.yaml"


def test_the_recipe_names_a_classifier_judge_as_the_only_reward():
    (env,) = yaml.safe_load(RECIPE.read_text())["data"]["env"]
    settings = JudgeSettings.from_recipe(env["judge"], "data.env 'exclaim'")
    assert env["id"] == "exclaim" and settings.kind == "classifier" and settings.weight == 1.0


def test_a_two_step_fit_with_the_classifier_judge_runs(tmp_path, tiny_model, tiny_classifier):
    with open(RECIPE) as f:
        env = yaml.safe_load(f)["data"]["env"][0]
    env = {**env, "args": {"num_tasks": 16}, "judge": {**env["judge"], "model": tiny_classifier}}
    argv = judge_fit_argv(tmp_path, tiny_model, "j", env)
    assert main(argv) == 0
    rows = read_metrics(tmp_path / "j")
    assert [int(r["step"]) for r in rows] == [0, 1]
    for r in rows:
        assert float(r["reward"]) == pytest.approx(float(r["env/reward/rm"]))  # the judge's score alone
        assert float(r["env/reward/rm_min"]) <= float(r["env/reward/rm"]) <= float(r["env/reward/rm_max"])
        assert float(r["env/reward/rm_std"]) >= 0 and 0 <= float(r["env/exclaims"]) <= 1
    samples = [json.loads(line) for line in open(tmp_path / "j" / "samples.jsonl")]
    assert samples and all(float(s["notes"]["judge/rm/reply"]) == pytest.approx(s["reward"]) for s in samples)


def test_a_str_metric_is_a_note_and_a_reward_metric_has_its_spread():
    import torch

    from grpokit.orchestrator.stats import batch_metrics
    from grpokit.types import Rollout

    def rollout(score: float) -> Rollout:
        metrics = {"reward/rm": score, "judge/rm/reply": repr(score)}
        return Rollout(0, "exclaim", 0, [1], [2], [0.0], [1], score, False, 0, metrics=metrics)

    rollouts = [rollout(0.0), rollout(1.0), rollout(0.5)]
    assert rollouts[1].notes == {"judge/rm/reply": "1.0"} and rollouts[1].metrics == {"reward/rm": 1.0}
    metrics = batch_metrics(0, rollouts, torch.tensor([[0.0, 1.0, 0.5]], dtype=torch.float64), {})
    assert metrics["env/reward/rm"] == pytest.approx(0.5) and metrics["env/reward/rm_std"] == pytest.approx(0.408248)
    assert metrics["env/reward/rm_min"] == 0.0 and metrics["env/reward/rm_max"] == 1.0


def test_groups_a_failed_judge_drops_are_left_out_of_the_batch(tmp_path, tiny_model):
    """on_failure drop_group: a dead judge's groups are not trained (groups_trained 0) and prompts.jsonl
    names why (judge_failed); the run goes on."""
    from tests.judges.helpers import dead_url

    judge = {"kind": "http", "model": "j", "base_url": dead_url(), "rubric": "r", "name": "rm", "retries": 0}
    env = {"id": "exclaim", "args": {"num_tasks": 16}, "judge": {**judge, "on_failure": "drop_group"}}
    argv = judge_fit_argv(tmp_path, tiny_model, "d", env, max_tokens=4)
    assert main(argv) == 0
    rows = read_metrics(tmp_path / "d")
    assert [float(r["groups_trained"]) for r in rows] == [0.0, 0.0]
    assert all(float(r["env/judge/rm/dropped"]) == 1.0 and float(r["env/judge/rm/down"]) == 1.0 for r in rows)
    records = [json.loads(line) for line in open(tmp_path / "d" / "prompts.jsonl")]
    assert [sorted(r["dropped"]["judge_failed"]) for r in records if r["step"] is not None] == [[0, 1], [2, 3]]
