"""Batch arithmetic with ms-swift's aliases, and a generation reused over several optimizer steps."""

import json

import pytest

from grpokit.main import main
from grpokit.orchestrator.batching import BatchShape, resolve_batch_shape
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics


def test_defaults_and_aliases():
    assert resolve_batch_shape(None, None, None, None, None, 1) == BatchShape(32, 8, 1, 1)
    assert resolve_batch_shape(None, None, 64, 4, 8, 2) == BatchShape(16, 8, 4, 2)  # 64 / 4 steps
    assert resolve_batch_shape(16, None, 64, None, 4, 1) == BatchShape(16, 4, 4, 1)  # 64 / 16


@pytest.mark.parametrize(
    "args,message",
    [
        ((None, 8, 60, None, None, 1), r"generation_batch_size \(60\) % data.num_generations \(8\) must be 0"),
        ((16, 8, 64, 3, None, 1), r"must equal data.batch_size \(16\) \* data.steps_per_generation \(3\)"),
        ((24, 8, 64, None, None, 1), r"must be a multiple of data.batch_size \(24\)"),
        ((None, 8, None, None, 4, 1), r"rollouts_per_example \(8\) and its alias data.num_generations \(4\) disagree"),
        ((None, None, None, None, None, 0), r"num_iterations must be >= 1"),
    ],
)
def test_invalid_combinations_state_the_formula(args, message):
    with pytest.raises(ValueError, match=message):
        resolve_batch_shape(*args)


def test_locate_cycles_chunks_then_iterations():
    shape = BatchShape(8, 4, 2, 2)
    assert [shape.locate(s) for s in range(5)] == [(0, 0, 0), (0, 1, 0), (0, 0, 1), (0, 1, 1), (1, 0, 0)]


def test_one_generation_feeds_four_steps(tmp_path, tiny_model):
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "r",
        "--data.batch_size",
        "null",
        "--data.generation_batch_size",
        "16",
        "--data.steps_per_generation",
        "2",
        "--data.num_iterations",
        "2",
        "--data.sampling.max_tokens",
        "6",
        "--data.eval",
        "null",
        "--data.num_logged_samples",
        "100",
        "--trainer.max_steps",
        "4",
        "--ckpt.interval",
        "0",
    )
    assert main(argv) == 0
    by_step: dict[int, list] = {}
    for line in open(tmp_path / "r" / "samples.jsonl"):
        s = json.loads(line)
        by_step.setdefault(s["step"], []).append((s["example_id"], s["completion"], s["policy_step"]))
    assert sorted(by_step) == [0, 1, 2, 3]
    assert all(p == 0 for rows in by_step.values() for _, _, p in rows)  # one generation, sampled with weights 0
    assert by_step[0] != by_step[1]  # two chunks of the generation
    assert by_step[2] == by_step[0] and by_step[3] == by_step[1]  # second pass (num_iterations 2) reuses them


def test_groups_older_than_max_off_policy_steps_are_dropped(tmp_path, tiny_model):
    # one generation (weights 0) feeds 3 optimizer steps (num_iterations 3): at step 2 it is 2 steps old
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "r",
        "--data.num_iterations",
        "3",
        "--data.max_async_level",
        "0",
        "--data.max_off_policy_steps",
        "1",
        "--data.sampling.max_tokens",
        "6",
        "--data.eval",
        "null",
        "--trainer.max_steps",
        "4",
        "--ckpt.interval",
        "0",
    )
    assert main(argv) == 0

    rows = read_metrics(tmp_path / "r")
    assert [float(r["groups_trained"]) for r in rows] == [2.0, 2.0, 0.0, 2.0]
    assert [float(r["dropped_off_policy_groups"]) for r in rows] == [0.0, 0.0, 2.0, 0.0]
