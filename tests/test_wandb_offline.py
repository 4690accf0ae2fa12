"""wandb, when configured, logs offline without network beside the always-on CSV metrics."""

import csv
from pathlib import Path

import pytest

from grpokit.cli import main

RECIPE = str(Path(__file__).resolve().parents[1] / "recipes" / "reverse_text.yaml")


def test_wandb_offline_run(tmp_path, tiny_model, monkeypatch):
    pytest.importorskip("wandb", reason="the [wandb] extra is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    argv = [
        "fit", "--config", RECIPE, "--output_dir", str(tmp_path), "--run_name", "w", "--model.model", tiny_model,
        "--model.lora.rank", "4", "--data.batch_size", "8", "--data.rollouts_per_example", "4",
        "--data.sampling.max_tokens", "6", "--data.seq_len", "128", "--data.filters", "[]", "--data.eval", "null",
        "--trainer.max_steps", "2", "--ckpt.interval", "0", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        "--trainer.logger", "WandbLogger", "--trainer.logger.init_args.offline", "true",
        "--trainer.logger.init_args.project", "grpokit-test", "--trainer.logger.init_args.save_dir", str(tmp_path),
    ]
    assert main(argv) == 0
    rows = [r for r in csv.DictReader(open(tmp_path / "w" / "metrics.csv")) if r.get("loss")]
    assert len(rows) == 2
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs and any(runs[0].glob("*.wandb"))
