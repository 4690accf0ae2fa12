"""Online eval: schedule on hand cases, and end to end on the tiny model."""

import csv
import json

from grpokit.main import main
from grpokit.orchestrator.evaluation import EvalSettings
from grpokit.testing import tiny_fit_argv


def test_schedule():
    s = EvalSettings(interval=5)
    assert s.due(0, None) and not s.due(3, 0) and s.due(5, 0) and s.due(6, 0) and not s.due(7, 6) and s.due(10, 6)
    assert not EvalSettings(interval=5, eval_base_model=False).due(0, None)
    assert not EvalSettings(interval=0).due(0, None)


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
