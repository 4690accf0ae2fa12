"""The sweep tests' recipe overlay: the shipped recipe shrunk to the tiny model."""

from pathlib import Path

import pytest
import yaml


@pytest.fixture
def tiny_overlay(tmp_path, tiny_model):
    """A function (steps, ckpt_interval) -> path of an overlay: 2 prompts x 4 rollouts of <= 8 tokens per
    step, no filters, no eval, `steps` steps, a checkpoint every `ckpt_interval` steps (0: none)."""

    def write(steps: int, ckpt_interval: int) -> Path:
        path = tmp_path / "tiny.yaml"
        overlay = {
            "model": {"model": tiny_model, "lora": {"rank": 4}},
            "data": {
                "batch_size": 8,
                "rollouts_per_example": 4,
                "sampling": {"max_tokens": 8},
                "seq_len": 128,
                "filters": [],
                "eval": None,
            },
            "trainer": {"max_steps": steps, "enable_progress_bar": False, "enable_model_summary": False},
            "ckpt": {"interval": ckpt_interval},
        }
        path.write_text(yaml.safe_dump(overlay))
        return path

    return write
