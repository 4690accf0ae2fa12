"""One recipe, both stages: `grpokit sft --config F` then `grpokit fit --config F` (grpokit.cli.stages) on
the tiny model, and the shipped pipeline recipe parses for both commands."""

import pytest
import yaml

from grpokit.cli.lightning_cli import make_cli
from grpokit.cli.recipe_files import shipped_recipe
from grpokit.cli.sft import make_sft_cli
from grpokit.main import main
from grpokit.sft.datamodule import SFTData
from tests.support import read_metrics

ENV = [{"id": "reverse-text", "args": {"num_tasks": 72, "min_words": 1, "max_words": 2}}]


def pipeline(tmp_path, tiny_model) -> str:
    recipe = {
        "output_dir": str(tmp_path),
        "run_name": "grpo",
        "num_threads": 1,
        "model": {"model": tiny_model, "lora": {"rank": 4, "alpha": 8}},
        "data": {
            "env": ENV,
            "batch_size": 8,
            "rollouts_per_example": 4,
            "sampling": {"max_tokens": 8},
            "seq_len": 128,
            "filters": [],
        },
        "trainer": {"max_steps": 2, "enable_progress_bar": False},
        "sft": {
            "run_name": "warm",
            "num_threads": 1,
            "model": {"lora": None, "lr": 1.0e-2, "warmup_steps": 0},
            "data": {"env": ENV, "answer_field": "answer", "batch_size": 8},
            "trainer": {"max_steps": 2, "enable_progress_bar": False},
        },
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


def test_sft_then_fit_on_one_file(tmp_path, tiny_model):
    recipe = pipeline(tmp_path, tiny_model)
    with pytest.raises(ValueError, match="run `grpokit sft` with the same --config first"):
        main(["fit", "--config", recipe])  # GRPO before its SFT stage: refused at start, naming the fix
    assert not (tmp_path / "grpo").exists()

    assert main(["sft", "--config", recipe]) == 0
    assert len(read_metrics(tmp_path / "warm")) == 2 and (tmp_path / "warm" / "model").is_dir()
    assert main(["fit", "--config", recipe]) == 0
    saved = yaml.safe_load((tmp_path / "grpo" / "config.yaml").read_text())
    assert saved["model"]["init_from"] == str(tmp_path / "warm") and saved["sft"]["run_name"] == "warm"
    assert len(read_metrics(tmp_path / "grpo")) == 2
    # the summary's eval command: the run's SFT weights beside its own, though eval's output_dir is the run
    flags = ["--ckpt", str(tmp_path / "grpo"), "--base", "--k", "1", "--num_examples", "2"]
    assert main(["eval", "--config", recipe, *flags, "--out", str(tmp_path / "e.json")]) == 0


@pytest.mark.parametrize("name", ["reverse_text", "shapes_vision"])
def test_the_shipped_pipeline_recipes_parse_for_both_commands(tmp_path, name):
    recipe = str(shipped_recipe(f"{name}_pipeline"))
    sft = make_sft_cli(["--config", recipe, "--output_dir", str(tmp_path)], run=False)
    assert isinstance(sft.datamodule, SFTData) and sft.run.run_dir == tmp_path / f"{name}_sft"
    (tmp_path / f"{name}_sft" / "model").mkdir(parents=True)  # as if the SFT stage had finished
    fit = make_cli(["--config", recipe, "--output_dir", str(tmp_path), "--sft", "null"], run=False)
    assert fit.model.init_from is None
