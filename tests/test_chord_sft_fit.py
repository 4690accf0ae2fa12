"""End to end: `grpokit fit` with Chord whose expert sequences come from a separate SFT dataset (data.expert.path,
as ms-swift's chord_sft_dataset): it trains, and each step's metrics count the dataset's expert rows; the
reference-answer source (one expert per group) still works as before."""

import json

import pytest

from grpokit.main import main
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics


def test_chord_trains_on_per_step_records_of_an_sft_dataset(tmp_path, tiny_model):
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps({"question": f"Reverse: ab{i}", "reply": f"{i}ba"}) + "\n" for i in range(6)))
    expert = json.dumps({"path": str(sft), "fields": {"prompt": "question", "completion": "reply"}, "per_step": 2})
    argv = tiny_fit_argv(
        tmp_path, tiny_model, "chord", "--trainer.max_steps", "2", "--model.loss", "Chord", "--data.expert", expert
    )
    assert main(argv) == 0
    steps = [r for r in read_metrics(tmp_path / "chord", None) if r.get("loss")]
    assert [int(r["step"]) for r in steps] == [0, 1]
    for r in steps:
        assert float(r["expert_seqs"]) == 2.0
        assert float(r["expert_tokens"]) >= 4  # each reply's tokens and its EOS
        assert float(r["mu"]) == pytest.approx(0.1)  # Chord's SFT weight (its default mu_valley)
        assert float(r["grad_norm"]) > 0


def test_chord_with_reference_answers_still_adds_one_expert_per_group(tmp_path, tiny_model):
    argv = tiny_fit_argv(
        tmp_path, tiny_model, "ref", "--trainer.max_steps", "1", "--model.loss", "Chord", "--data.expert", "{}"
    )
    assert main(argv) == 0
    [step] = [r for r in read_metrics(tmp_path / "ref", None) if r.get("loss")]
    assert float(step["expert_seqs"]) == 2.0  # 8 rollouts in groups of 4
    assert float(step["expert_tokens"]) > 0
