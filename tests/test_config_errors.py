"""Invalid recipe values fail at start with a message that names the key and the rule."""

import re
from pathlib import Path

import pytest

from grpokit.cli import make_cli

RECIPE = str(Path(__file__).resolve().parents[1] / "recipes" / "reverse_text.yaml")

CASES = [
    (["--data.batch_size", "30"], r"data.batch_size \(30\) must be a positive multiple of data.rollouts_per_example \(8\)"),
    (["--data.max_async_level", "-1"], r"data.max_async_level must be >= 0"),
    (["--data.max_async_level", "3", "--data.max_off_policy_steps", "2"], r"max_off_policy_steps \(2\) must be >= data.max_async_level \(3\)"),
    (["--data.sampling.temperature", "-0.5"], r"temperature must be >= 0"),
    (["--data.sampling.top_p", "1.5"], r"top_p must be in \(0, 1\]"),
    (["--data.sampling.max_tokens", "0"], r"max_tokens must be >= 1"),
    (["--data.buffer.max_resample_times", "-2"], r"max_resample_times must be >= 0"),
    (["--data.eval.num_examples", "0"], r"num_examples >= 1"),
    (["--ckpt.keep_last", "0"], r"keep_last >= 1"),
    (["--trainer.max_steps", "-1"], r"trainer.max_steps must be a positive number"),
    (["--model.loss.init_args.token_mask_high", "0.5"], r"token_mask_low <= 1 <= token_mask_high"),
    (["--broadcast.init_args.keep_last", "1"], r"broadcast.init_args.keep_last must be >= 2"),
    (["--data.temp_scheduler", '{"type": "linear", "start_temperature": 1.0, "end_temperature": 0.5}'], r"either data.sampling.temperature or data.temp_scheduler"),
    (["--data.sampling.temperature", "null", "--data.temp_scheduler", '{"start_temperature": 0}'], r"temperatures must be > 0"),
    (["--model.activation_memory_budget", "0.2"], r"model.activation_memory_budget \(0.2\) needs model.compile: true"),
    (["--model.compile", "true", "--model.activation_memory_budget", "1.5"], r"a value in \(0, 1\]"),
]


@pytest.mark.parametrize("overrides,message", CASES, ids=[c[0][0] for c in CASES])
def test_invalid_value_names_the_key(overrides, message, tmp_path, capsys):
    with pytest.raises((ValueError, SystemExit)) as info:
        make_cli(["--config", RECIPE, "--output_dir", str(tmp_path), *overrides], run=False)
    text = str(info.value) + capsys.readouterr().err
    assert re.search(message, text), text[-2000:]
