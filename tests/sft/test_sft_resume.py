"""Kill `grpokit sft` with SIGKILL after a checkpoint, resume with --ckpt.resume_step -1: every step is
trained once, on the same examples, with the same losses as an uninterrupted run, bit for bit."""

import torch
from safetensors.torch import load_file

from grpokit.main import main
from tests.sft.test_sft_cli import sft_argv
from tests.support import read_metrics
from tests.support.processes import kill_after_checkpoint

MAX_STEPS = 8


def argv(tmp_path, tiny_model, name, *extra):
    return sft_argv(tmp_path, tiny_model, name, "--trainer.max_steps", str(MAX_STEPS), "--ckpt.interval", "2", *extra)


def test_sigkill_then_resume_continues_exactly(tmp_path, tiny_model):
    run = tmp_path / "killed"
    kill_after_checkpoint(argv(tmp_path, tiny_model, "killed"), run / "checkpoints" / "step_2.ckpt")
    killed_at = max(int(p.stem[5:]) for p in (run / "checkpoints").glob("step_*.ckpt"))
    assert killed_at < MAX_STEPS and not (run / "model").exists()

    assert main(argv(tmp_path, tiny_model, "killed", "--ckpt.resume_step", "-1")) == 0
    assert main(argv(tmp_path, tiny_model, "straight")) == 0

    resumed, straight = read_metrics(run), read_metrics(tmp_path / "straight")
    assert [int(r["step"]) for r in resumed] == list(range(MAX_STEPS))  # each step trained exactly once
    for key in ("loss", "loss_tokens", "grad_norm", "lr", "epoch"):
        assert [r[key] for r in resumed] == [r[key] for r in straight], key
    evals = [(r["step"], r["eval_loss"]) for r in read_metrics(run, "eval_loss")]
    assert evals[-1] == next(
        (r["step"], r["eval_loss"])
        for r in read_metrics(tmp_path / "straight", "eval_loss")
        if r["step"] == str(MAX_STEPS)
    )  # noqa: E501

    # LoRA: the final folder holds the adapter and the base with it merged, equal to the uninterrupted run's
    merged, again = (
        load_file(run / "model" / "model.safetensors"),
        load_file(tmp_path / "straight" / "model" / "model.safetensors"),
    )
    base = load_file(f"{tiny_model}/model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    assert (run / "model" / "adapter" / "adapter_model.safetensors").is_file()
    assert not torch.equal(merged[name], base[name]) and torch.equal(merged[name], again[name])
