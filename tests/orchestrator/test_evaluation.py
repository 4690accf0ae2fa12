"""Online eval: schedule on hand cases, and end to end on the tiny model."""

import json
import re

import pytest

from grpokit.environments.environment import Environment, EnvSpec
from grpokit.inference import SamplingSettings
from grpokit.main import main
from grpokit.orchestrator.evaluation import EvalSettings, Evaluator
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics


def test_schedule():
    s = EvalSettings(interval=5)
    assert s.due(0, None) and not s.due(3, 0) and s.due(5, 0) and s.due(6, 0) and not s.due(7, 6) and s.due(10, 6)
    assert not EvalSettings(interval=5, eval_base_model=False).due(0, None)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"interval": 0}, "data.eval.interval must be >= 1, got 0; set data.eval: null to turn evaluation off"),
        ({"num_examples": 0}, "data.eval.num_examples must be >= 1, or -1 for every example, got 0"),
        ({"rollouts_per_example": 0}, "data.eval.rollouts_per_example must be >= 1, got 0"),
    ],
)
def test_bad_settings_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        EvalSettings(**kwargs)


def test_eval_end_to_end(tmp_path, tiny_model):
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "r",
        "--data.sampling.max_tokens",
        "6",
        "--data.max_async_level",
        "0",
        "--data.eval.interval",
        "2",
        "--data.eval.num_examples",
        "3",
        "--trainer.max_steps",
        "4",
        "--ckpt.interval",
        "0",
    )
    assert main(argv) == 0
    evals = [json.loads(line) for line in open(tmp_path / "r" / "eval.jsonl")]
    assert [e["eval/weight_step"] for e in evals] == [0.0, 2.0]  # synchronous: batch n uses weights n
    rows = read_metrics(tmp_path / "r")
    assert [r["eval/reward"] != "" for r in rows] == [True, False, True, False]  # one row per step, no carried values


def test_skip_eval_on_resume_counts_the_resume_step_as_evaluated(tmp_path):
    envs = [Environment(EnvSpec(id="reverse-text", args={"num_tasks": 4}))]
    for skip, due in ((False, True), (True, False)):
        settings = EvalSettings(interval=4, num_examples=2, skip_eval_on_resume=skip)
        evaluator = Evaluator(settings, envs, SamplingSettings(), tmp_path, start_step=6)
        assert settings.due(6, evaluator.last_evaluated) is due  # resumed at step 6 with weights of step 6
        assert settings.due(8, evaluator.last_evaluated)  # the next multiple of interval is evaluated either way
    fresh = Evaluator(EvalSettings(interval=4, skip_eval_on_resume=True), envs, SamplingSettings(), tmp_path)
    assert fresh.last_evaluated is None  # a fresh run evaluates its base model as usual


def test_eval_num_examples_minus_one_is_every_example(tmp_path):
    envs = [Environment(EnvSpec(id="reverse-text", args={"num_tasks": 5}))]
    evaluator = Evaluator(EvalSettings(num_examples=-1), envs, SamplingSettings(), tmp_path)
    assert sorted(ex.index for _, ex in evaluator.prompts) == [0, 1, 2, 3, 4]


def test_oversampling_samples_more_groups_and_trains_on_the_first_kept(tmp_path, tiny_model):
    argv = tiny_fit_argv(
        tmp_path, tiny_model, "r", "--data.buffer.oversampling_factor", "2", "--trainer.max_steps", "1",
        "--data.max_async_level", "0", "--ckpt.interval", "0",
    )  # fmt: skip
    assert main(argv) == 0
    row = read_metrics(tmp_path / "r")[0]
    assert (float(row["groups_generated"]), float(row["groups_trained"])) == (4.0, 2.0)


def test_max_steps_minus_one_trains_one_pass_over_the_data(tmp_path, tiny_model):
    """12 examples, 2 prompts a step: 6 steps draw each example once, and the lr schedule runs over them."""
    env = '[{"id": "reverse-text", "args": {"num_tasks": 12}}]'
    argv = tiny_fit_argv(
        tmp_path, tiny_model, "r", "--trainer.max_steps", "-1", "--data.env", env,
        "--data.eval", "null", "--ckpt.interval", "0", "--model.lr_schedule", "cosine",
    )  # fmt: skip
    assert main(argv) == 0
    rows = read_metrics(tmp_path / "r")
    assert [int(float(r["step"])) for r in rows] == list(range(6))
    assert float(rows[-1]["lr"]) < float(rows[0]["lr"])  # the cosine decays over the 6 steps


def test_max_steps_minus_one_needs_grpokit_fit(tmp_path, tiny_model, capsys):
    from grpokit.main import entry

    assert entry(tiny_fit_argv(tmp_path, tiny_model, "r", "--trainer.max_steps", "-1", command="train")) == 2
    assert "trainer.max_steps -1 (one pass over the data) is counted by `grpokit fit`" in capsys.readouterr().err
