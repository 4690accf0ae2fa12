"""Recipe files read once before jsonargparse parses them, so a YAML syntax error names its file.

jsonargparse reports a broken YAML file as "Problems parsing config: ... in "<unicode string>", line 2",
which does not say which of several `--config` files it is. Missing files and inline YAML strings are
left to jsonargparse, whose messages for them are already clear.
"""

from __future__ import annotations

from pathlib import Path

import yaml


def config_paths(argv: list[str]) -> list[str]:
    """The values of every `--config PATH`, `--config=PATH` and `-c PATH` in `argv`."""
    paths = []
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            paths.append(argv[i + 1])
        elif arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
    return paths


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
