"""A run's resolved recipe: the recipe, overlays and overrides parsed by grpokit.cli.parse_recipe.

Every run of a sweep is resolved before any run starts, so a misspelt key or a wrong value fails the
sweep at once with jsonargparse's message (naming the key) instead of failing run 3 an hour later. The
resolved file is what the run is launched with, so a resumed sweep runs exactly what it started even if
the recipe file was edited in between.
"""

from __future__ import annotations

import warnings

from grpokit.cli import RecipeError, parse_recipe
from grpokit.sweep.spec import SweepError


def resolve_config(recipe_argv: list[str], run_label: str) -> str:
    """The resolved recipe (YAML) for `grpokit fit` arguments `recipe_argv`, without building anything."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="LightningCLI's args parameter"
        )  # the sweep's sys.argv is not the run's
        try:
            return parse_recipe(recipe_argv)
        except RecipeError as e:
            raise SweepError(f"run {run_label}: the recipe does not parse with this run's settings:\n{e}") from None
