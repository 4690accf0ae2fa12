"""grpokit.cli.parse_recipe: the resolved recipe without building anything, errors as RecipeError."""

from importlib.resources import files

import pytest
import yaml

from grpokit.cli import RecipeError, parse_recipe

RECIPE = str(files("grpokit.recipes") / "reverse_text.yaml")


def test_the_resolved_recipe_has_every_default_and_the_swaps_reset(capsys):
    text = parse_recipe(["--config", RECIPE, "--model.loss", "GSPO", "--trainer.max_steps", "7"])
    recipe = yaml.safe_load(text)
    assert recipe["trainer"]["max_steps"] == 7 and recipe["data"]["batch_size"] == 32
    loss = recipe["model"]["loss"]
    assert loss["class_path"] == "grpokit.registry.losses.gspo.GSPO"
    assert "token_mask_low" not in loss["init_args"]  # AIPO's settings were not carried over to GSPO
    assert capsys.readouterr().out == ""  # nothing printed, nothing built


def test_a_misspelt_key_is_a_recipe_error_with_a_suggestion(capsys):
    with pytest.raises(RecipeError, match=r"did you mean --data\.batch_size"):
        parse_recipe(["--config", RECIPE, "--data.batch_sise", "8"])
    assert capsys.readouterr().out == ""
