"""The recipe command line: `grpokit fit | train | infer | orchestrate` parse one YAML recipe
(LightningCLI + jsonargparse) and build its components. Public: `make_cli` (parse, build, and run or
not), `parse_recipe` (the resolved recipe, nothing built) and `GrpoCLI`; the tools built on the recipe
CLI (sweep, bench) use these, never the reverse."""

from grpokit.cli.errors import RecipeError
from grpokit.cli.lightning_cli import GrpoCLI, make_cli, parse_recipe

__all__ = ["GrpoCLI", "RecipeError", "make_cli", "parse_recipe"]
