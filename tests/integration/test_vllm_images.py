"""vLLM (PyPI's CPU build, 0.32) samples prompts with images: VLLMEngine sends a group's pictures and its ids
before expansion to vLLM's token-in route (grpokit.inference.vllm.images), checks that vLLM's prompt ids are
grpokit's, and the trainer's forward reproduces vLLM's logprobs.

On the tiny Idefics3. The tiny Qwen2.5-VL runs only where the vLLM venv has torchvision: vLLM's Qwen2-VL
module imports transformers' torchvision image processor, and scripts/vllm_cpu_env.sh removes torchvision
(PyPI's wheel is a CUDA build, which does not load beside the CPU torch). Needs the venv of
scripts/vllm_cpu_env.sh; skipped without it. About 1.5 minutes per test on 2 CPU cores. A conversation
whose later turn brings a picture is sampled by vLLM too (its grown ImageSource).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from grpokit.testing import build_tiny_idefics3, build_tiny_qwen2_5_vl, free_port, tiny_fit_argv
from tests.integration.test_vllm_cpu import SERVED, START_TIMEOUT, VLLM_PYTHON, vllm_serve_args, wait_for_models
from tests.support import drain, read_metrics

BUILDERS = {"idefics3": build_tiny_idefics3, "qwen2_5_vl": build_tiny_qwen2_5_vl}

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not VLLM_PYTHON.exists(),
        reason=f"no vLLM venv at {VLLM_PYTHON}: run scripts/vllm_cpu_env.sh or set GRPOKIT_VLLM_PYTHON",
    ),
]


def vllm_has_torchvision() -> bool:
    return any(VLLM_PYTHON.parent.parent.glob("lib/python*/site-packages/torchvision/__init__.py"))


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def vl_model(request, tmp_path_factory) -> tuple[str, str]:
    """(family, the tiny model's folder); Qwen2.5-VL skipped where vLLM cannot import its module."""
    if request.param == "qwen2_5_vl" and not vllm_has_torchvision():
        pytest.skip("vLLM's Qwen2-VL module needs torchvision, which the CPU venv has not (module docstring)")
    return request.param, str(BUILDERS[request.param](tmp_path_factory.mktemp(request.param)))


@contextlib.contextmanager
def vllm_server(model: str, tmp_path: Path, *extra: str):
    """vLLM's OpenAI server on `model` (float32, --enable-scale-out unless `extra` says otherwise); its /v1 URL."""
    port, log_path = free_port(), tmp_path / "vllm.log"
    command = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name",
               SERVED, "--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "8", "--port", str(port),
               *(extra or ["--enable-scale-out"])]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        wait_for_models(url, server, log_path, time.monotonic() + START_TIMEOUT)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


def test_vllm_samples_image_prompts_token_faithfully(vl_model, tmp_path):
    """A whole batch (a prompt with two pictures beside a text prompt), a streamed group and a cut group's
    continuations sampled by vLLM: the trainer's forward gives their logprobs (token_mult_prob_error within
    1e-4 of 1); the same ids without the pictures are off, and ids vLLM expands otherwise are refused."""
    import torch
    from transformers import AutoModelForImageTextToText

    from grpokit.inference import SamplingSettings
    from grpokit.inference.streams import GroupRequest
    from grpokit.inference.vllm.engine import VLLMEngine
    from grpokit.vision.inputs import ImageSource
    from grpokit.vision.render import load_processor, render_prompt
    from tests.vision.pictures import striped
    from tests.vision.test_served_images import trainer_error

    family, path = vl_model
    processor = load_processor(path)
    content = [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "What colour is shape 4?"}]
    pictures = [striped(56, 42, 4), striped(70, 42, 5)]
    rendered = render_prompt(processor, [{"role": "user", "content": content}], pictures, keep_source=True)
    text_ids = processor.tokenizer.encode("Reverse the text: hello")
    sampling = SamplingSettings(temperature=1.0, max_tokens=8, seed=2)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    with vllm_server(path, tmp_path) as url:
        engine = VLLMEngine(base_url=url, model_name=SERVED)
        engine.setup(path)
        assert engine.samples_images and engine.takes_vision
        image_group, text_group = engine.generate(
            [rendered.prompt_ids, text_ids], 3, sampling, vision=[rendered.vision, None]
        )
        stream = engine.open_stream(sampling, max_rows=8)  # InterruptingStream: an image request is sent whole
        assert stream.takes_images
        stream.submit(GroupRequest("g", rendered.prompt_ids, 3, 7, vision=rendered.vision))
        streamed = drain(stream)["g"]
        stream.close()
        rows = [rendered.prompt_ids, rendered.prompt_ids + image_group[0].token_ids[:2]]  # a cut group's rows
        continued = engine._post((url, engine._body(rows, 1, sampling, 0, rendered.vision)))
        (blind,) = engine.generate([rendered.prompt_ids], 3, sampling)  # the same ids without their pictures
        source = rendered.vision.source
        rendered.vision.source = ImageSource(source.images, source.prompt_ids, source.prompt_ids)  # expanded twice
        with pytest.raises(ValueError, match="expanded this prompt's images into other ids"):
            engine.generate([rendered.prompt_ids], 1, sampling, vision=[rendered.vision])
        rendered.vision.source = source
    errors = {
        name: trainer_error(model, rendered.prompt_ids, rendered.vision, completions, 1.0)
        for name, completions in (("whole", image_group), ("streamed", streamed), ("blind", blind))
    }
    print(f"\n{family}: vLLM token_mult_prob_error {errors}")
    assert abs(errors["whole"] - 1) < 1e-4 and abs(errors["streamed"] - 1) < 1e-4
    assert abs(errors["blind"] - 1) > 1e-3  # the check would see pictures that did not reach vLLM
    assert all(c.token_ids for c in image_group) and len(text_group) == 3
    assert sorted(c["index"] for c in continued["choices"]) == [0, 1]  # each row's prompt ids checked
    assert all(c["token_ids"] for c in continued["choices"])


def test_vllm_samples_a_later_turns_picture_token_faithfully(vl_model, tmp_path, monkeypatch):
    """`shapes` (tries 2) whose `respond` shows each reply a picture of its own, played by VLLMEngine
    (2 prompts x 3 rollouts): each second turn is sent as the whole conversation's ids before expansion with
    both pictures, vLLM's prompt ids are grpokit's on every request, and the trainer's forward gives vLLM's
    logprobs (token_mult_prob_error within 1e-4 of 1); scored with another rollout's later picture, it is off."""
    from dataclasses import replace
    from types import SimpleNamespace

    import torch
    from transformers import AutoModelForImageTextToText

    from grpokit.environments.environment import Environment, EnvSpec
    from grpokit.envs.shapes import ShapesRetryTask
    from grpokit.inference.vllm import engine as engine_module
    from grpokit.inference.vllm import images
    from grpokit.inference.vllm.engine import VLLMEngine
    from tests.vision.test_later_turn_images import mismatch, respond_with_a_picture, two_turns

    family, path = vl_model
    sent, checked = [], []  # (pictures, ids grpokit samples) per request; vLLM's prompt ids == grpokit's, each
    requests, check = engine_module.generate_requests, images.check_prompt_ids
    monkeypatch.setattr(engine_module, "generate_requests", lambda *a: record(sent, requests(*a)))
    monkeypatch.setattr(
        images, "check_prompt_ids", lambda url, got, ids: (checked.append(got == ids), check(url, got, ids))
    )
    monkeypatch.setattr(ShapesRetryTask, "respond", respond_with_a_picture)
    env = Environment(EnvSpec("shapes", {"num_tasks": 2, "tries": 2}))
    start = time.monotonic()
    with vllm_server(path, tmp_path) as url:  # about 110 ids a conversation: 256 is room
        engine = VLLMEngine(base_url=url, model_name=SERVED)
        engine.setup(path)
        _, rollouts = two_turns(path, env, engine)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    scorer = SimpleNamespace(model=model)
    shown = [r for r in rollouts if "Now this one:" in r.completion_text]
    later = [ids for pictures, ids in sent if pictures == 2]
    error = mismatch(scorer, rollouts)
    swapped = []  # within a group (the same first picture): each rollout scored with another's later one
    for group in {r.group_id for r in shown}:
        mine = [r for r in shown if r.group_id == group]
        swapped += [replace(r, vision=o.vision) for r, o in zip(mine, mine[1:] + mine[:1])] if len(mine) > 1 else []
    blind = mismatch(scorer, swapped) if swapped else None
    print(f"\n{family}: vLLM, later-turn pictures in {time.monotonic() - start:.1f}s: {len(shown)} of {len(rollouts)} "
          f"rollouts shown a picture, {len(later)} second-turn requests, token_mult_prob_error {error:.9f}, "
          f"with another rollout's later picture {blind}")  # fmt: skip
    assert len(shown) >= len(rollouts) // 2 and len(later) == len(shown)
    assert len(checked) == len(sent) and all(checked)  # vLLM's prompt ids are grpokit's, every request
    full = [r.prompt_ids + r.completion_ids for r in shown]
    assert all(any(f[: len(ids)] == ids for f in full) for ids in later)  # the whole conversation so far
    assert abs(error - 1) < 1e-4
    assert blind is None or abs(blind - 1) > 1e-3  # the check above sees each rollout's own later picture


def record(sent: list, requests: list[tuple[dict, list[int]]]) -> list[tuple[dict, list[int]]]:
    """`requests` (generate_requests') as they are, each one's (number of pictures, ids) added to `sent`."""
    sent += [(len(request["content_parts"]), ids) for request, ids in requests]
    return requests


def test_a_server_without_the_token_in_route_is_refused_at_start(tmp_path):
    """vLLM started without --enable-scale-out answers 403 on /inference/v1/generate: VLLMEngine's
    samples_images names the flag (ImagePrompts.for_envs stops the run at start with it)."""
    from grpokit.inference.vllm.engine import VLLMEngine

    path = str(build_tiny_idefics3(tmp_path / "idefics3"))
    with vllm_server(path, tmp_path, "--enforce-eager") as url:
        engine = VLLMEngine(base_url=url, model_name=SERVED)
        engine.setup(path)
        with pytest.raises(ValueError, match="--enable-scale-out"):
            assert engine.samples_images


def test_fit_on_image_prompts_samples_from_vllm(vl_model, tmp_path, monkeypatch):
    """`grpokit fit --inference VLLMEngine` starts vLLM on the tiny VLM itself (with --enable-scale-out, and
    data.pixel_budget.max_images 1 as vLLM's `--limit-mm-per-prompt {"image": 1}`: the shapes prompts hold
    one picture) and trains 2 steps of the shapes environment at max_async_level 0, the second sampled with the
    hot-loaded adapter of the first: token_mult_prob_error within 1e-4 of 1 at both. A reward that varies
    within groups (odd-length replies score 1: the random models never name a colour) makes step 0's
    update non-zero."""
    import verifiers.v1 as vf

    from grpokit.envs.shapes import ShapesTask
    from grpokit.main import main

    @vf.reward(weight=1.0)
    async def correct(self, trace) -> float:
        return float(len(trace.last_reply or "") % 2)

    monkeypatch.setattr(ShapesTask, "correct", correct)
    family, path = vl_model
    env = [{"id": "shapes", "args": {"num_tasks": 16}}]
    argv = tiny_fit_argv(
        tmp_path, path, family, "--data.env", json.dumps(env), "--data.eval", "null", "--data.max_async_level", "0",
        "--data.seq_len", "256", "--data.timeout", "120", "--trainer.max_steps", "2", "--ckpt.interval", "0",
        "--model.lr", "1e-2", "--data.pixel_budget", '{"max_images": 1}', *vllm_serve_args(free_port()),
    )  # fmt: skip
    start = time.monotonic()
    assert main(argv) == 0
    server_log = (tmp_path / family / "vllm_server.log").read_text()
    assert "'enable_scale_out': True" in server_log and "'limit_mm_per_prompt': {'image': 1}" in server_log
    rows = read_metrics(tmp_path / family)
    errors = [float(r["token_mult_prob_error"]) for r in rows]
    print(f"\n{family}: fit with vLLM in {time.monotonic() - start:.1f}s, token_mult_prob_error per step {errors}, "
          f"step 0 grad_norm {rows[0]['grad_norm']}")  # fmt: skip
    assert [int(r["step"]) for r in rows] == [0, 1]
    assert all(abs(e - 1) < 1e-4 for e in errors)
    assert float(rows[0]["grad_norm"]) > 0 and all(float(r["loss_tokens"]) > 0 for r in rows)
    samples = [json.loads(line) for line in open(tmp_path / family / "samples.jsonl")]
    assert {s["policy_step"] for s in samples} == {0, 1}  # step 1 sampled with the hot-loaded adapter
