"""Every shipped overlay (a swapped loss, advantage or schedule) trains end to end on the tiny model."""

import json
import math
from pathlib import Path

import pytest

from grpokit.main import main
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
OVERLAYS = sorted((RECIPES / "ablations").glob("*.yaml"))


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.stem)
def test_overlay_trains_on_tiny_model(overlay, tmp_path, tiny_model):
    # the overlay's --config follows the tiny sizes; the keys an overlay could touch are restated after it
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "r",
        "--config",
        str(overlay),
        "--model.model",
        tiny_model,
        "--model.lora.rank",
        "4",
        "--data.filters",
        "[]",
        "--trainer.max_steps",
        "2",
        "--ckpt.interval",
        "0",
    )
    if "path: sft.jsonl" in overlay.read_text():  # an overlay that names the user's SFT dataset: write one
        pairs = [{"prompt": f"Reverse: {w}", "completion": w[::-1]} for w in ("apple", "river", "stone", "cloud")]
        (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))
        argv += ["--data.expert.path", str(tmp_path / "sft.jsonl"), "--data.expert.per_step", "2"]
    assert main(argv) == 0
    rows = read_metrics(tmp_path / "r")
    assert [int(r["step"]) for r in rows] == [0, 1]
    assert all(math.isfinite(float(r["loss"])) and math.isfinite(float(r["grad_norm"])) for r in rows)
    assert any(float(r["grad_norm"]) > 0 for r in rows), "no gradient reached the adapter"
    config = (tmp_path / "r" / "config.yaml").read_text()
    for line in overlay.read_text().splitlines():  # the swapped component is what ran
        if "class_path:" in line and not line.strip().startswith("#"):
            assert line.split("class_path:")[1].split("#")[0].strip() in config
