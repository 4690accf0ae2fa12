"""Every shipped recipe parses and builds; bad recipes fail with a message naming the key."""

from pathlib import Path

import pytest

from grpokit.cli import make_cli
from grpokit.orchestrator import Orchestrator
from grpokit.trainer.policy import Policy

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
# sft recipes and pipelines (an SFT stage first): tests/sft/
BASES = sorted(p for p in RECIPES.glob("*.yaml") if not p.name.endswith(("_sft.yaml", "_pipeline.yaml")))
OVERLAYS = sorted(p for p in (RECIPES / "ablations").glob("*.yaml"))


@pytest.mark.parametrize("recipe", BASES, ids=lambda p: p.name)
def test_recipe_builds(recipe, tmp_path):
    # a top-level file that starts with "# Overlay" applies on top of the base recipe
    base = ["--config", str(RECIPES / "reverse_text.yaml")] if recipe.read_text().startswith("# Overlay") else []
    cli = make_cli([*base, "--config", str(recipe), "--output_dir", str(tmp_path)], run=False)
    assert isinstance(cli.model, Policy) and isinstance(cli.datamodule, Orchestrator)
    assert cli.trainer.max_steps > 0


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_overlay_builds_on_its_base(overlay, tmp_path):
    base = RECIPES / "reverse_text.yaml"
    cli = make_cli(["--config", str(base), "--config", str(overlay), "--output_dir", str(tmp_path)], run=False)
    assert isinstance(cli.model, Policy)


def test_unknown_key_names_the_key(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text((RECIPES / "reverse_text.yaml").read_text().replace("  warmup_steps: 2", "  warmup_stepz: 2"))
    with pytest.raises(SystemExit):
        make_cli(["--config", str(bad), "--output_dir", str(tmp_path)], run=False)
    assert "warmup_stepz" in capsys.readouterr().err


def test_wrong_type_names_the_key(tmp_path, capsys):
    with pytest.raises(SystemExit):
        make_cli(
            [
                "--config",
                str(RECIPES / "reverse_text.yaml"),
                "--output_dir",
                str(tmp_path),
                "--data.batch_size",
                "many",
            ],
            run=False,
        )
    err = capsys.readouterr().err
    assert "batch_size" in err and "many" in err


def test_impossible_batch_arithmetic_gives_the_formula(tmp_path):
    with pytest.raises(
        ValueError, match=r"batch_size \(30\) must be a positive multiple of data.rollouts_per_example \(8\)"
    ):
        make_cli(
            ["--config", str(RECIPES / "reverse_text.yaml"), "--output_dir", str(tmp_path), "--data.batch_size", "30"],
            run=False,
        )
