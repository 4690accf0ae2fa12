"""wandb, when configured, logs offline without network beside the always-on CSV metrics."""

import pytest

from grpokit.main import main
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics


def test_wandb_offline_run(tmp_path, tiny_model, monkeypatch):
    pytest.importorskip("wandb", reason="the [wandb] extra is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "w",
        "--data.sampling.max_tokens",
        "6",
        "--data.eval",
        "null",
        "--trainer.max_steps",
        "2",
        "--ckpt.interval",
        "0",
        "--trainer.logger",
        "WandbLogger",
        "--trainer.logger.init_args.offline",
        "true",
        "--trainer.logger.init_args.project",
        "grpokit-test",
        "--trainer.logger.init_args.save_dir",
        str(tmp_path),
    )
    assert main(argv) == 0
    rows = read_metrics(tmp_path / "w")
    assert len(rows) == 2
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs and any(runs[0].glob("*.wandb"))
