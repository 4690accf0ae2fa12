"""`grpokit fit` with image prompts (issue 36, must-show 1 on the builtin engine): the shapes environment's
pictures through the processor, the builtin engine, the batch files and the trainer's forward of each tiny
family; at max_async_level 0 the trainer's logprobs of step 0 equal the engine's."""

from __future__ import annotations

import json
import math

import pytest

from grpokit.main import main
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics


def image_fit_argv(tmp_path, model: str, name: str, *extra: str) -> list[str]:
    env = [{"id": "shapes", "args": {"num_tasks": 16}}]
    return tiny_fit_argv(
        tmp_path, model, name,
        "--data.env", json.dumps(env), "--data.eval", "null", "--data.max_async_level", "0",
        "--data.seq_len", "256", "--trainer.max_steps", "2", *extra,
    )  # fmt: skip


def test_a_two_step_fit_on_image_prompts_is_token_faithful(vl_family, tmp_path):
    family, path, _, _ = vl_family
    assert main(image_fit_argv(tmp_path, path, family)) == 0
    rows = read_metrics(tmp_path / family)
    assert [int(r["step"]) for r in rows] == [0, 1]
    error = float(rows[0]["token_mult_prob_error"])
    print(f"{family}: step 0 token_mult_prob_error = {error:.9f}")
    assert abs(error - 1) < 1e-4
    for r in rows:
        assert math.isfinite(float(r["loss"])) and float(r["loss_tokens"]) > 0
    samples = [json.loads(line) for line in open(tmp_path / family / "samples.jsonl")]
    assert samples and {s["env"] for s in samples} == {"shapes"}
    records = [json.loads(line) for line in open(tmp_path / family / "prompts.jsonl")]
    assert [r["trained"] for r in records if r["step"] is not None] == [[0, 1], [2, 3]]


def test_a_fit_of_an_image_environment_on_a_text_model_stops_at_start_naming_the_fix(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="environment 'shapes' .example 0. has images, .* set model.model to a vision"):
        main(image_fit_argv(tmp_path, tiny_model, "text"))
    assert not (tmp_path / "text" / "metrics.csv").exists()


def test_the_engines_fast_path_is_refused_image_prompts_at_start(tmp_path):
    """The fast path (continuous batching, CUDA graphs) does not sample image prompts: the run stops at
    start naming the engine and the fix, instead of sampling without the images."""
    from grpokit.testing import build_tiny_qwen2_5_vl

    path = str(build_tiny_qwen2_5_vl(tmp_path / "qwen"))
    engine = '{"class_path": "BuiltinEngine", "init_args": {"fast": "on"}}'
    with pytest.raises(ValueError, match="BuiltinEngine cannot sample yet .* BuiltinEngine with fast: off"):
        main(image_fit_argv(tmp_path, path, "fast", "--inference", engine))


def test_an_update_learned_from_image_prompts_reaches_the_engine(vl_family, tmp_path, monkeypatch):
    """With a reward that varies within groups (odd-length replies score 1: the random tiny models never
    name a colour), step 0 trains the text decoder's LoRA on image prompts, and step 1's batch, sampled
    with the updated adapter (max_async_level 0), is still token-faithful."""
    import verifiers.v1 as vf

    from grpokit.envs.shapes import ShapesTask

    @vf.reward(weight=1.0)
    async def correct(self, trace) -> float:
        return float(len(trace.last_reply or "") % 2)

    monkeypatch.setattr(ShapesTask, "correct", correct)
    family, path, _, _ = vl_family
    assert main(image_fit_argv(tmp_path, path, family, "--model.lr", "1e-2")) == 0
    rows = read_metrics(tmp_path / family)
    errors = [r["token_mult_prob_error"] for r in rows]
    print(f"{family}: token_mult_prob_error {errors}, step 0 grad_norm {rows[0]['grad_norm']}")
    assert float(rows[0]["grad_norm"]) > 0 and float(rows[0]["reward_std"]) > 0
    for r in rows:
        assert abs(float(r["token_mult_prob_error"]) - 1) < 1e-4, r["step"]
    broadcasts = sorted(p.name for p in (tmp_path / family / "broadcasts").glob("step_*"))
    assert "step_1" in broadcasts


def test_a_streamed_fit_on_image_prompts_within_a_pixel_budget(tmp_path):
    """data.streaming (groups submitted as others finish, max_async_level 1) and data.pixel_budget (84x84
    pictures scaled to fit 56x56) take image prompts too: step 0 is token-faithful."""
    from grpokit.testing import build_tiny_qwen2_5_vl

    path = str(build_tiny_qwen2_5_vl(tmp_path / "qwen"))
    env = [{"id": "shapes", "args": {"num_tasks": 16, "size": 84}}]
    extra = ["--data.streaming", '{"max_inflight": 2}', "--data.max_async_level", "1", "--data.env", json.dumps(env),
             "--data.pixel_budget", '{"max_pixels": 3136, "over_budget": "resize"}']  # fmt: skip
    assert main(image_fit_argv(tmp_path, path, "stream", *extra)) == 0
    rows = read_metrics(tmp_path / "stream")
    assert [int(r["step"]) for r in rows] == [0, 1]
    assert abs(float(rows[0]["token_mult_prob_error"]) - 1) < 1e-4
