"""A `custom` advantage: any Advantage subclass, selected in a recipe by its class path with init_args."""

import json
import math
import textwrap

import pytest
import torch

from grpokit.main import main
from grpokit.testing import check_advantage, tiny_fit_argv
from tests.support import read_metrics

SOURCE = '''
import torch

from grpokit.advantage import Advantage, zero_flat_groups


class ClippedCentered(Advantage):
    """r - group mean, clipped to [-clip, clip] (a lab's own advantage)."""

    def __init__(self, clip: float = 1.0) -> None:
        self.clip = clip

    def __call__(self, rewards_PG: torch.Tensor, lengths_PG: torch.Tensor) -> torch.Tensor:
        return zero_flat_groups(
            (rewards_PG - rewards_PG.mean(-1, keepdim=True)).clamp(-self.clip, self.clip), rewards_PG
        )
'''


def test_custom_advantage_by_class_path_with_kwargs_trains(tmp_path, tiny_model, monkeypatch):
    (tmp_path / "lab_advantages.py").write_text(textwrap.dedent(SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = json.dumps({"class_path": "lab_advantages.ClippedCentered", "init_args": {"clip": 0.25}})
    argv = tiny_fit_argv(
        tmp_path, tiny_model, "c", "--data.advantage", spec, "--trainer.max_steps", "1", "--ckpt.interval", "0"
    )
    assert main(argv) == 0
    config = (tmp_path / "c" / "config.yaml").read_text()
    assert "class_path: lab_advantages.ClippedCentered" in config and "clip: 0.25" in config
    [row] = read_metrics(tmp_path / "c")
    assert math.isfinite(float(row["loss"])) and math.isfinite(float(row["grad_norm"]))

    from lab_advantages import ClippedCentered

    rewards = torch.tensor([[0.0, 1.0, 0.4]], dtype=torch.float64)  # mean 0.4667: -0.4667, 0.5333, -0.0667
    assert ClippedCentered(clip=0.25)(rewards, torch.ones_like(rewards))[0].tolist() == pytest.approx(
        [-0.25, 0.25, -0.4 / 6], abs=1e-12
    )
    check_advantage(ClippedCentered(clip=0.25))
