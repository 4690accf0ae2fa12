"""End to end: `grpokit fit` on a tiny random model trains, logs, broadcasts, and is deterministic."""

import json

import pytest

from grpokit.main import main
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics


def tiny_fit(tmp_path, tiny_model, name, *extra):
    argv = tiny_fit_argv(tmp_path, tiny_model, name, "--model.lr", "1e-3", "--trainer.max_steps", "3", *extra)
    assert main(argv) == 0
    run = tmp_path / name
    return run, read_metrics(run, None)


def step_rows(rows):
    return [r for r in rows if r.get("loss")]


def test_tiny_fit_end_to_end(tmp_path, tiny_model):
    run, rows = tiny_fit(tmp_path, tiny_model, "a")
    steps = step_rows(rows)
    assert [int(r["step"]) for r in steps] == [0, 1, 2]
    for r in steps:
        for key in (
            "loss",
            "kl",
            "masked_frac",
            "tokens",
            "grad_norm",
            "reward",
            "reward_std",
            "seq_len",
            "token_mult_prob_error",
            "gen_time",
            "train_time",
        ):
            assert r[key] != "", key
        assert float(r["off_policy_gap_max"]) <= 1  # max_async_level 1
    # the engine's logprobs match the trainer's before the first update
    assert float(steps[0]["token_mult_prob_error"]) == pytest.approx(1.0, abs=1e-3)
    assert (run / "config.yaml").exists()
    samples = [json.loads(line) for line in open(run / "samples.jsonl")]
    assert {s["step"] for s in samples} == {0, 1, 2}
    assert all(s["policy_step"] >= max(0, s["step"] - 1) for s in samples)
    stable = sorted(int(p.parent.name[5:]) for p in (run / "broadcasts").glob("step_*/STABLE"))
    assert stable[-1] == 3  # weights after the last of 3 steps were published
    assert (run / "broadcasts" / "step_3" / "adapter_config.json").exists()


def test_tiny_fit_is_deterministic(tmp_path, tiny_model):
    extra = ["--data.max_async_level", "0"]  # synchronous: the sampled weights do not depend on timing
    _, a = tiny_fit(tmp_path, tiny_model, "a", *extra)
    _, b = tiny_fit(tmp_path, tiny_model, "b", *extra)
    assert [r["loss"] for r in step_rows(a)] == [r["loss"] for r in step_rows(b)]
    assert [r["reward"] for r in step_rows(a)] == [r["reward"] for r in step_rows(b)]


def test_a_step_with_every_rollout_masked_trains_nothing_and_says_so(tmp_path, tiny_model, caplog):
    """max_tokens 1 with the Overlong filter enforced masks every rollout: the step's loss is an exact 0, the
    weights do not move, `loss_tokens` is 0, and a warning names the filter that masked them."""
    overlong = '[{"class_path": "Overlong", "init_args": {"enforce": true}}]'
    with caplog.at_level("WARNING", logger="grpokit.trainer.guards"):
        run, rows = tiny_fit(
            tmp_path, tiny_model, "masked", "--data.sampling.max_tokens", "1", "--data.filters", overlong
        )
    steps = step_rows(rows)
    assert [float(r["loss_tokens"]) for r in steps] == [0.0, 0.0, 0.0]
    assert [float(r["grad_norm"]) for r in steps] == [0.0, 0.0, 0.0]
    warnings = [r.getMessage() for r in caplog.records if "trains on no token" in r.getMessage()]
    assert warnings and "filter/overlong 1.00" in warnings[0], caplog.text[-2000:]
