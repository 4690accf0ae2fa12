"""Every sweep file in recipes/sweeps/ resolves each of its runs on the base recipe."""

from pathlib import Path

import pytest
import yaml

from grpokit.sweep.launchers import LocalLauncher
from grpokit.sweep.runner import SweepRunner
from grpokit.sweep.spec import load_sweep

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


@pytest.mark.parametrize("sweep", sorted((RECIPES / "sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_sweep_resolves_every_run(sweep, tmp_path):
    spec = load_sweep(sweep)
    runner = SweepRunner(
        spec, ["--config", str(RECIPES / "reverse_text.yaml")], tmp_path / spec.name, LocalLauncher(), 1
    )
    runner.prepare()
    resolved = [yaml.safe_load((runner.run_dir(run) / "resolved.yaml").read_text()) for run in spec.runs]
    assert len({yaml.safe_dump(r) for r in resolved}) == len(spec.runs)  # no two runs are the same


def test_the_loss_sweep_is_three_losses_by_two_seeds(tmp_path):
    spec = load_sweep(RECIPES / "sweeps" / "reverse_text_losses.yaml")
    runner = SweepRunner(
        spec, ["--config", str(RECIPES / "reverse_text.yaml")], tmp_path / spec.name, LocalLauncher(), 1
    )
    runner.prepare()
    resolved = [yaml.safe_load((runner.run_dir(run) / "resolved.yaml").read_text()) for run in spec.runs]
    losses = sorted({r["model"]["loss"]["class_path"].rsplit(".", 1)[-1] for r in resolved})
    assert losses == ["AIPO", "ClippedPG", "GSPO"]
    # the replicates vary seed_everything alone; data.seed follows it, and the sampling seed follows data.seed
    assert sorted((r["seed_everything"], r["data"]["seed"]) for r in resolved) == [(0, 0)] * 3 + [(1, 1)] * 3
    assert {r["data"]["sampling"]["seed"] for r in resolved} == {None}
    clipped = next(r for r in resolved if r["model"]["loss"]["class_path"].endswith("ClippedPG"))
    assert clipped["model"]["loss"]["init_args"]["eps_high"] == 0.28  # the overlay's clip-higher, not the class default
