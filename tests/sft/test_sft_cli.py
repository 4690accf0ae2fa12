"""`grpokit sft` end to end on the tiny model: the loss falls, the held-out eval is logged, the run leaves
a model folder, and `grpokit fit`'s model.init_from starts from it."""

import json
from importlib.resources import files

import pytest
import torch
from safetensors.torch import load_file

from grpokit.cli.sft import make_sft_cli
from grpokit.main import main
from grpokit.sft.datamodule import SFTData
from grpokit.testing import tiny_fit_argv
from grpokit.trainer.policy import Policy
from grpokit.trainer.sft import SFTPolicy
from tests.support import read_metrics

RECIPE = str(files("grpokit.recipes") / "reverse_text_sft.yaml")


def sft_argv(tmp_path, tiny_model, name, *extra):
    """The shipped SFT recipe on the tiny model: 64 reverse-text tasks, 8 per step, 8 held out."""
    return [
        "sft",
        "--config",
        RECIPE,
        "--output_dir",
        str(tmp_path),
        "--run_name",
        name,
        "--model.model",
        tiny_model,
        "--model.lora.rank",
        "4",
        "--model.lr",
        "1e-2",
        "--model.warmup_steps",
        "0",
        "--data.env",
        "[{id: reverse-text, args: {num_tasks: 72, min_words: 1, max_words: 2}}]",
        "--data.batch_size",
        "8",
        "--data.eval_fraction",
        "0.12",
        "--data.eval_interval",
        "3",
        "--trainer.enable_progress_bar",
        "false",
        "--num_threads",
        "1",
        *extra,
    ]


def test_the_shipped_recipe_builds(tmp_path):
    cli = make_sft_cli([f"--config={RECIPE}", "--output_dir", str(tmp_path)], run=False)
    assert isinstance(cli.model, SFTPolicy) and isinstance(cli.datamodule, SFTData)
    assert type(cli.model.loss).__name__ == "NLL" and cli.trainer.max_steps > 0


def test_sft_loss_falls_and_the_run_can_start_grpo(tmp_path, tiny_model):
    assert main(sft_argv(tmp_path, tiny_model, "sft", "--trainer.max_steps", "6", "--model.lora", "null")) == 0
    run = tmp_path / "sft"
    rows = read_metrics(run)
    assert [int(r["step"]) for r in rows] == list(range(6))
    losses = [float(r["loss"]) for r in rows]
    assert losses[-1] < losses[0] - 0.8, losses  # 10.86 (near-uniform over 49k ids) -> 9.57 at lr 1e-2
    assert all(float(r["loss_tokens"]) > 0 and "kl" not in r for r in rows)  # no sampling metrics
    evals = read_metrics(run, "eval_loss")
    assert [int(r["step"]) for r in evals] == [0, 3, 6]
    assert float(evals[-1]["eval_loss"]) < float(evals[0]["eval_loss"])
    assert 0 <= float(evals[-1]["eval_token_accuracy"]) <= 1

    model = run / "model"
    assert json.loads((model / "grpokit_sft.json").read_text())["base_model"] == tiny_model
    assert (model / "tokenizer.json").is_file() and not (model / "adapter").exists()  # full weights
    policy = Policy(model=tiny_model, init_from=str(run))  # grpokit fit --model.init_from RUN
    assert policy.model_name == str(model)
    policy.configure_model()
    trained, base = load_file(model / "model.safetensors"), load_file(f"{tiny_model}/model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(trained[name], base[name])  # the SFT weights
    assert torch.equal(dict(policy.lm.named_parameters())[name], trained[name])

    # grpokit fit from it: the engine samples with the SFT weights too (its logprobs match the trainer's)
    argv = tiny_fit_argv(tmp_path, tiny_model, "grpo", "--trainer.max_steps", "1", "--model.init_from", str(run))
    assert main(argv) == 0
    (row,) = read_metrics(tmp_path / "grpo")
    assert float(row["token_mult_prob_error"]) == pytest.approx(1.0, abs=1e-3)

    # its export merges the GRPO adapter into the SFT weights, not into model.model's
    assert main(["export", str(tmp_path / "grpo"), "--merge", "--out", str(tmp_path / "merged")]) == 0
    merged = load_file(tmp_path / "merged" / "model.safetensors")
    untouched = "model.embed_tokens.weight"  # not a LoRA target: the SFT run's weight as it was
    assert torch.equal(merged[untouched], trained[untouched]) and not torch.equal(merged[untouched], base[untouched])
    # and its eval takes the run's own recipe (model.init_from included)
    recipe = ["--config", str(tmp_path / "grpo" / "config.yaml"), "--output_dir", str(tmp_path), "--run_name", "ev"]
    flags = ["--ckpt", str(tmp_path / "grpo"), "--k", "2", "--num_examples", "2", "--out", str(tmp_path / "e.json")]
    assert main(["eval", *recipe, *flags]) == 0
    assert json.loads((tmp_path / "e.json").read_text())


def test_init_from_refuses_another_base_or_an_unfinished_run(tmp_path, tiny_model):
    (tmp_path / "run" / "model").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="not a finished `grpokit sft` run"):
        Policy(model=tiny_model, init_from=str(tmp_path / "run"))
    (tmp_path / "run" / "model" / "grpokit_sft.json").write_text(json.dumps({"base_model": "other/model"}))
    with pytest.raises(
        ValueError, match="fine-tuned from 'other/model', but model.model is .*set model.model: other/model"
    ):
        Policy(model=tiny_model, init_from=str(tmp_path / "run"))
