"""End to end: a tiny `grpokit fit` with QeRL noise. The engine's norm weights differ from the trainer's
by the scheduled sigma, the trainer's stay clean bit for bit, sigma is logged, and training proceeds."""

import math

import pytest
import torch
from safetensors.torch import load_file

from grpokit.broadcast.filesystem import NORMS_FILE
from grpokit.cli import make_cli
from grpokit.common.models import load_causal_lm
from grpokit.common.noisy_norms import norm_weights
from grpokit.registry.noise.qerl import QeRL
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics

MAX_STEPS = 3  # QeRL's 10 stages over 3 steps: weight steps 0, 1, 2, 3 are in stages 0, 3, 6, 9


def noise_std(noisy: dict, clean: dict) -> float:
    return torch.cat([(noisy[k].float().cpu() - clean[k].detach().float().cpu()).flatten() for k in clean]).std().item()


def test_qerl_noise_reaches_the_engine_and_only_the_engine(tmp_path, tiny_model):
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "qerl",
        "--trainer.max_steps",
        str(MAX_STEPS),
        "--data.max_async_level",
        "0",
        "--model.noise_scheduler",
        "QeRL",
    )
    cli = make_cli(argv)
    schedule = [QeRL().sigma(step, MAX_STEPS) for step in range(MAX_STEPS + 1)]
    assert schedule[0] == 0 and all(s > 0 for s in schedule[1:])

    rows = read_metrics(tmp_path / "qerl")
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    assert [float(r["noise_sigma"]) for r in rows] == pytest.approx(schedule[:MAX_STEPS], rel=1e-6)
    assert all(math.isfinite(float(r["loss"])) and float(r["grad_norm"]) > 0 for r in rows)

    clean = norm_weights(load_causal_lm(tiny_model))  # LoRA: the trainer's norms are the base model's
    trainer = norm_weights(cli.model.lm)
    assert all(torch.equal(trainer[k].cpu(), clean[k]) for k in clean), "the trainer's norm weights must stay clean"

    engine = cli.config_init["fit"]["inference"]
    assert engine.weight_step == MAX_STEPS - 1  # synchronous: the last batch was sampled with step-2 weights
    engine_norms = norm_weights(engine.model)
    assert noise_std(engine_norms, trainer) == pytest.approx(
        schedule[MAX_STEPS - 1], rel=0.15
    )  # 5 norms x 64 = 320 draws
    published = load_file(tmp_path / "qerl" / "broadcasts" / f"step_{MAX_STEPS - 1}" / NORMS_FILE)
    assert all(
        torch.equal(engine_norms[k].cpu(), published[k]) for k in published
    )  # the engine loaded exactly what was pushed

    for step in range(1, MAX_STEPS + 1):  # every kept push: fresh noise of its stage's sigma on the clean weights
        noisy = load_file(tmp_path / "qerl" / "broadcasts" / f"step_{step}" / NORMS_FILE)
        assert noise_std(noisy, clean) == pytest.approx(schedule[step], rel=0.15)


def test_noise_with_vllm_fails_at_start(tmp_path, tiny_model):
    argv = tiny_fit_argv(tmp_path, tiny_model, "v", "--inference", "VLLMEngine", "--model.noise_scheduler", "QeRL")
    with pytest.raises(ValueError, match="model.noise_scheduler.*VLLMEngine"):
        make_cli(argv)
    assert not (tmp_path / "v" / "broadcasts").exists()  # nothing was published: it failed before the run
