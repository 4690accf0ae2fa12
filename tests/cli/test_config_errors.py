"""Invalid recipe values fail at start with a message that names the key and the rule."""

import re
from pathlib import Path

import pytest

from grpokit.cli import make_cli
from grpokit.main import main

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "reverse_text.yaml")

CASES = [
    (
        ["--data.batch_size", "30"],
        r"data.batch_size \(30\) must be a positive multiple of data.rollouts_per_example \(8\)",
    ),
    (["--data.max_async_level", "-1"], r"data.max_async_level must be >= 0"),
    (
        ["--data.max_async_level", "3", "--data.max_off_policy_steps", "2"],
        r"max_off_policy_steps \(2\) must be >= data.max_async_level \(3\)",
    ),
    (["--data.sampling.temperature", "-0.5"], r"temperature must be 0 \(greedy\) or a finite number >= 0.01"),
    (["--data.sampling.temperature", "1e-45"], r"temperature must be 0 \(greedy\) or .*overflows the logits"),
    (["--data.sampling.repetition_penalty", "1e300"], r"repetition_penalty must be in \(0, 100\] .*got 1e\+300"),
    (["--data.sampling.top_p", "1.5"], r"top_p must be in \(0, 1\]"),
    (["--data.sampling.max_tokens", "0"], r"max_tokens must be >= 1"),
    (["--data.buffer.max_resample_times", "-2"], r"max_resample_times must be >= 0"),
    (["--data.eval.num_examples", "0"], r"data.eval.num_examples must be >= 1, or -1 for every example"),
    (["--ckpt.keep_last", "0"], r"keep_last >= 1"),
    (
        ["--trainer.max_steps", "-2"],
        r"trainer.max_steps must be a positive number of GRPO steps \(or -1: one pass over the data\), got -2",
    ),
    (["--model.loss.init_args.token_mask_high", "0.5"], r"token_mask_low <= 1 <= token_mask_high"),
    (["--broadcast.init_args.keep_last", "1"], r"broadcast.init_args.keep_last must be >= 2"),
    (
        ["--data.temp_scheduler", '{"type": "linear", "start_temperature": 1.0, "end_temperature": 0.5}'],
        r"either data.sampling.temperature or data.temp_scheduler",
    ),
    (
        ["--data.sampling.temperature", "null", "--data.temp_scheduler", '{"start_temperature": 0}'],
        r"temperatures must be finite numbers >= 0.01",
    ),
    (["--model.activation_memory_budget", "0.2"], r"model.activation_memory_budget \(0.2\) needs model.compile: true"),
    (["--model.compile", "true", "--model.activation_memory_budget", "1.5"], r"a value in \(0, 1\]"),
    (
        ["--trainer.strategy", "fsdp"],
        r"trainer.strategy fsdp \(Lightning's FSDP1\): use trainer.strategy: fsdp2",
    ),  # before Lightning's "needs a GPU"
    (["--trainer.strategy", "deepspeed_stage_2"], r"DeepSpeed is not supported"),
]


@pytest.mark.parametrize("overrides,message", CASES, ids=[c[0][0] for c in CASES])
def test_invalid_value_names_the_key(overrides, message, tmp_path, capsys):
    with pytest.raises((ValueError, SystemExit)) as info:
        make_cli(["--config", RECIPE, "--output_dir", str(tmp_path), *overrides], run=False)
    text = str(info.value) + capsys.readouterr().err
    assert re.search(message, text), text[-2000:]


def test_a_run_folder_with_checkpoints_is_not_started_over(tmp_path):
    (tmp_path / "r" / "checkpoints").mkdir(parents=True)
    (tmp_path / "r" / "checkpoints" / "step_3.ckpt").write_bytes(b"")
    with pytest.raises(
        ValueError, match=r"already holds a run with checkpoints \(steps 3\): resume it with --ckpt.resume_step -1"
    ):
        make_cli(["--config", RECIPE, "--output_dir", str(tmp_path), "--run_name", "r"], run=False)


def test_a_fresh_fit_archives_an_attempt_that_stopped_before_its_first_checkpoint(tmp_path, tiny_model):
    """An earlier attempt that left batches but no checkpoint is moved to archive/attempt_*/ (nothing to
    resume; nothing lost), so the new run trains on its own batches, not the stale rollouts/step_N. The
    stale step 0 here is garbage: had the trainer read it, the run would stop with a BatchFormatError."""
    from grpokit.testing import tiny_fit_argv

    run = tmp_path / "r"
    (run / "rollouts").mkdir(parents=True)
    (run / "rollouts" / "step_0.safetensors").write_bytes(b"stale batch of an earlier attempt")
    (run / "samples.jsonl").write_text('{"step": 0, "stale": true}\n')
    (run / "resolved.yaml").write_text("a sweep's file stays\n")
    assert (
        main(
            tiny_fit_argv(
                tmp_path, tiny_model, "r", "--trainer.max_steps", "1", "--ckpt.interval", "0", "--data.eval", "null"
            )
        )
        == 0
    )
    [archive] = (run / "archive").glob("attempt_*")
    assert (archive / "rollouts" / "step_0.safetensors").read_bytes() == b"stale batch of an earlier attempt"
    assert "stale" in (archive / "samples.jsonl").read_text() and "stale" not in (run / "samples.jsonl").read_text()
    assert (run / "resolved.yaml").is_file() and (run / "metrics.csv").is_file()


def test_errors_before_training_print_one_line_naming_the_key(tmp_path, capsys):
    from grpokit.main import entry as main  # the `grpokit` command

    assert (
        main(
            [
                "fit",
                "--config",
                RECIPE,
                "--output_dir",
                str(tmp_path),
                "--data.buffer",
                "{skip_verification: true, online_difficulty_filtering: true}",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "grpokit: error: data.buffer.skip_verification leaves every reward 0" in err and "Traceback" not in err
    assert (
        main(
            ["fit", "--config", RECIPE, "--output_dir", str(tmp_path), "--run_name", "none", "--ckpt.resume_step", "-1"]
        )
        == 2
    )
    assert (
        "no checkpoints in" in capsys.readouterr().err and not (tmp_path / "none").exists()
    )  # a refused start leaves no folder
