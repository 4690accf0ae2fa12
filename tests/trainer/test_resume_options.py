"""ckpt.skip_progress (weights only, count from 0, earlier files archived) and ckpt.skip_buffer (no
easy/hard pools restored), on the tiny model."""

import json

import pytest
from safetensors.torch import load_file

from grpokit.main import main
from grpokit.orchestrator.pools import read_log
from grpokit.testing import tiny_fit_argv
from grpokit.trainer.checkpoint import CheckpointSettings, archive_progress
from tests.support import read_metrics

# the tiny model never answers arithmetic (reward 0: hard pool) and always earns some reverse-text credit
ENVS = '[{"id": "reverse-text", "args": {"num_tasks": 2}}, {"id": "arithmetic", "args": {"num_tasks": 2}}]'


def fit(tmp_path, tiny_model, *overrides):
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "run",
        "--data.env",
        ENVS,
        "--data.buffer.hard_threshold",
        "0.0",
        "--data.eval",
        "null",
        "--data.num_logged_samples",
        "100",
        "--ckpt.interval",
        "2",
        *overrides,
    )
    assert main(argv) == 0
    run = tmp_path / "run"
    steps = [int(r["step"]) for r in read_metrics(run)]
    return steps, [json.loads(line) for line in open(run / "samples.jsonl")]


def adapter(folder):
    return load_file(folder / "adapter_model.safetensors")


def test_skip_progress_then_skip_buffer(tmp_path, tiny_model):
    run = tmp_path / "run"
    fit(tmp_path, tiny_model, "--trainer.max_steps", "2")
    assert sorted(m["key"] for m in read_log(run / "buffer.jsonl")) == ["arithmetic/0", "arithmetic/1"]

    # skip_progress: count from 0 with the weights of step 2, the hard pool kept, the old files archived
    steps, samples = fit(
        tmp_path, tiny_model, "--trainer.max_steps", "1", "--ckpt.resume_step", "-1", "--ckpt.skip_progress", "true"
    )
    (archive,) = (run / "archive").iterdir()
    assert (
        steps == [0]
        and (archive / "checkpoints" / "step_2.ckpt").exists()
        and (run / "checkpoints" / "step_1.ckpt").exists()
    )
    old, new = adapter(archive / "broadcasts" / "step_2"), adapter(run / "broadcasts" / "step_0")
    assert all((old[k] == new[k]).all() for k in old)  # step 0 of the new count samples with step 2's weights
    assert any(
        (old[k] != adapter(archive / "broadcasts" / "step_0")[k]).any() for k in old
    )  # which training had changed
    assert {s["env"] for s in samples} == {"reverse-text"}  # the restored hard pool: arithmetic is not sampled
    assert [m["generation"] for m in read_log(run / "buffer.jsonl")] == [-1, -1]

    # skip_buffer: a plain resume (step 1 of the new count) with empty pools
    steps, samples = fit(
        tmp_path, tiny_model, "--trainer.max_steps", "2", "--ckpt.resume_step", "-1", "--ckpt.skip_buffer", "true"
    )
    assert steps == [0, 1] and all(m["generation"] >= 1 for m in read_log(run / "buffer.jsonl"))


def test_skip_options_need_resume_step():
    with pytest.raises(ValueError, match=r"ckpt.skip_progress applies when resuming: set ckpt.resume_step"):
        CheckpointSettings(skip_progress=True)
    with pytest.raises(ValueError, match=r"ckpt.skip_buffer applies when resuming"):
        CheckpointSettings(skip_buffer=True)


def test_archive_moves_everything_but_copies_the_pool_log(tmp_path):
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "metrics.csv").write_text("step\n")
    (tmp_path / "buffer.jsonl").write_text("{}\n")
    dest = archive_progress(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["archive", "buffer.jsonl"]
    assert sorted(p.name for p in dest.iterdir()) == ["buffer.jsonl", "metrics.csv", "rollouts"]
