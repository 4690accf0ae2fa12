"""Prompts too long for a sequence are skipped and counted; a completion cap past the model's context is
refused at start."""

import json
import re

import pytest

from grpokit.main import entry, main
from grpokit.orchestrator.prompt_length import prompt_token_limit
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics


def test_the_limit_is_what_fits_sequence_and_context_minus_the_completion():
    assert prompt_token_limit(max_tokens=8, seq_len=128, context=None, max_prompt_tokens=None) == 120
    assert prompt_token_limit(max_tokens=8, seq_len=1024, context=512, max_prompt_tokens=None) == 504
    assert prompt_token_limit(max_tokens=8, seq_len=128, context=512, max_prompt_tokens=50) == 50
    assert prompt_token_limit(max_tokens=8, seq_len=128, context=512, max_prompt_tokens=500) == 120
    with pytest.raises(ValueError, match=r"data.max_prompt_tokens must be >= 1 \(or null\), got 0"):
        prompt_token_limit(max_tokens=8, seq_len=128, context=None, max_prompt_tokens=0)


def test_max_tokens_past_the_models_context_is_refused_before_sampling(tmp_path, tiny_model, capsys):
    """The tiny model has 512 positions: 600 tokens of completion cannot be sampled or trained."""
    argv = tiny_fit_argv(tmp_path, tiny_model, "r", "--data.sampling.max_tokens", "600", "--data.seq_len", "2048")
    assert entry(argv) == 2
    err = capsys.readouterr().err
    assert re.search(r"data.sampling.max_tokens \(600\) must be below the model's context \(512 positions", err), err
    assert not (tmp_path / "r" / "rollouts").exists()


def test_over_long_prompts_are_skipped_and_counted(tmp_path, tiny_model, caplog):
    data = tmp_path / "mixed.jsonl"
    rows = [{"question": "Say hi.", "answer": "hi"}, {"question": "Say yes.", "answer": "yes"}]
    rows += [{"question": "word " * 300 + "Say no.", "answer": "no"}] * 2
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = json.dumps([{"id": "jsonl", "args": {"path": str(data)}}])
    argv = tiny_fit_argv(
        tmp_path, tiny_model, "r", "--data.env", env, "--trainer.max_steps", "3", "--data.max_async_level", "0"
    )
    assert main(argv) == 0  # a 300-word prompt in a 128-token sequence used to end the run
    rows = read_metrics(tmp_path / "r")
    skipped = [float(r["prompts_too_long"]) for r in rows]
    assert len(rows) == 3 and sum(skipped) > 0 and all(s in (0, 1, 2) for s in skipped), skipped
    assert "prompt of" in caplog.text and "over the limit of 120" in caplog.text


@pytest.mark.parametrize("streaming", [False, True], ids=["whole-batch", "streaming"])
def test_a_pass_without_a_prompt_that_fits_stops_the_run(tmp_path, tiny_model, capsys, caplog, streaming):
    """No prompt fits (max_prompt_tokens 1 is below any chat-templated prompt): streaming used to skip
    blocks forever, one WARNING each, and whole-batch generation to die with a raw ZeroDivisionError."""
    extra = ["--data.streaming", "{max_inflight: 2}"] if streaming else []
    argv = tiny_fit_argv(tmp_path, tiny_model, "r", "--data.max_prompt_tokens", "1", "--trainer.max_steps", "2", *extra)
    assert entry([*argv, "--data.env", "[{id: reverse-text, args: {num_tasks: 40}}]"]) == 1
    err = capsys.readouterr().err
    which = "40 prompts in a row" if streaming else "generation 0: all 2 prompts"
    assert f"no prompt of data.env fits: {which}" in err and "data.max_prompt_tokens" in err, err
    assert caplog.text.count("over the limit of 1 (") == (3 if streaming else 2)  # the run's first three
