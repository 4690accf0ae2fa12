"""The recipe's sources as grpokit reads them before jsonargparse does: the flags of argv in order
(`recipe_flags`), its `--config` files (`config_paths`, `read_recipe_file`), and a YAML syntax check that
names the broken file. The one reader of argv and of recipe files for the component checks and resets
(grpokit.cli.component_args) and for this check.

jsonargparse reports a broken YAML file as "Problems parsing config: ... in "<unicode string>", line 2",
which does not say which of several `--config` files it is. Missing files and inline YAML strings are
left to jsonargparse, whose messages for them are already clear.
"""

from __future__ import annotations

from pathlib import Path

import yaml

CONFIG_FLAGS = ("config", "c")  # --config PATH, --config=PATH, -c PATH


def recipe_flags(argv: list[str]):
    """(name, value) of every `--name value` and `--name=value` in argv, in order (name without dashes)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-") and "=" in arg:
            name, value = arg.split("=", 1)
            i += 1
        elif arg.startswith("-") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            name, value = arg, argv[i + 1]
            i += 2
        else:
            i += 1
            continue
        yield name.lstrip("-"), value


def config_paths(argv: list[str]) -> list[str]:
    """The values of every `--config PATH`, `--config=PATH` and `-c PATH` in `argv`."""
    return [value for name, value in recipe_flags(argv) if name in CONFIG_FLAGS]


def read_recipe_file(path: str) -> dict | None:
    """A `--config` file's contents; None for a missing or broken file (it gets its own clear error)."""
    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return None


def check_recipe_files(argv: list[str]) -> None:
    """Raise ValueError naming the file, line and column of the first `--config` file that is not valid YAML."""
    for path in config_paths(argv):
        if not Path(path).is_file():
            continue
        try:
            with open(path) as f:  # a stream, so that the error's marks name the file
                yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise ValueError(f"--config {path} is not valid YAML: {e}") from None
