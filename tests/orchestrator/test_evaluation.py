"""Online eval: schedule on hand cases, and end to end on the tiny model."""

import csv
import json
import re

import pytest

from grpokit.main import main
from grpokit.orchestrator.evaluation import EvalSettings
from grpokit.testing import tiny_fit_argv


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
    rows = [r for r in csv.DictReader(open(tmp_path / "r" / "metrics.csv")) if r.get("loss")]
    assert [r["eval/reward"] != "" for r in rows] == [True, False, True, False]  # one row per step, no carried values
