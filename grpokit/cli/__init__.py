"""The recipe command line: `grpokit fit | train | infer | orchestrate` parse one YAML recipe
(LightningCLI + jsonargparse) and build its components. Public: `make_cli` (parse, build, and run or
not) and `GrpoCLI`; tools built on the recipe CLI (sweep, bench) use these, never the reverse."""

from grpokit.cli.lightning_cli import GrpoCLI, make_cli

__all__ = ["GrpoCLI", "make_cli"]
