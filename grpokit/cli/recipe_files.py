"""The recipe's sources as grpokit reads them before jsonargparse does: the flags of argv in order
(`recipe_flags`), its `--config` files (`config_paths`, `read_recipe_file`), and a YAML syntax check that
names the broken file. The one reader of argv and of recipe files for the component checks and resets
(grpokit.cli.component_args) and for this check.

A `--config` value that is not a file may name a shipped recipe (`reverse_text`, `reverse_text.yaml`,
`ablations/gspo`, or as the docs write them, `recipes/reverse_text.yaml`): `resolve_recipe_names` puts the
installed file's path in its place before anything reads argv, so every command that takes `--config`
finds them; a file that exists always wins. Inline YAML strings are left to jsonargparse.

jsonargparse reports a broken YAML file as "Problems parsing config: ... in "<unicode string>", line 2",
which does not say which of several `--config` files it is.
"""

from __future__ import annotations

import difflib
from importlib.resources import files
from pathlib import Path

import yaml

CONFIG_FLAGS = ("config", "c")  # --config PATH, --config=PATH, -c PATH
RECIPE_SUFFIXES = (".yaml", ".yml")


def recipe_flags(argv: list[str]):
    """(name, value) of every `--name value` and `--name=value` in argv, in order (name without dashes)."""
    for _, name, value in _flag_positions(argv):
        yield name, value


def _flag_positions(argv: list[str]):
    """(index of the value's argument, name without dashes, value) of every flag with a value in argv."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-") and "=" in arg:
            name, value = arg.split("=", 1)
            at, i = i, i + 1
        elif arg.startswith("-") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            name, value = arg, argv[i + 1]
            at, i = i + 1, i + 2
        else:
            i += 1
            continue
        yield at, name.lstrip("-"), value


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


def shipped_recipes() -> dict[str, Path]:
    """The recipes installed with grpokit (the repository's recipes/ folder, package data of
    grpokit.recipes), by name: the path under that folder without `.yaml` (`ablations/gspo`)."""
    root = Path(str(files("grpokit.recipes")))
    found = sorted(root.rglob("*.yaml"), key=lambda p: (len(p.relative_to(root).parts), p.as_posix()))
    return {p.relative_to(root).with_suffix("").as_posix(): p for p in found}


def shipped_recipe(value: str) -> Path | None:
    """The shipped recipe `value` names, with or without `.yaml` and a leading `recipes/`; None if none."""
    return shipped_recipes().get(_recipe_name(value))


def _recipe_name(value: str) -> str:
    name = value.removeprefix("./").removeprefix("recipes/")
    for suffix in RECIPE_SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def unknown_recipe(value: str, problem: str) -> ValueError:
    """The error `problem` for `value`, no shipped recipe's name, with the closest shipped recipes (those of
    the same file name in another folder first), or all of them."""
    shipped, name = shipped_recipes(), _recipe_name(value)
    same_file = [n for n in shipped if n.rsplit("/", 1)[-1] == name.rsplit("/", 1)[-1]]
    close = list(dict.fromkeys(same_file + difflib.get_close_matches(name, shipped, n=5, cutoff=0.6)))[:5]
    listed = f"did you mean {', '.join(close)}?" if close else f"the shipped recipes are {', '.join(shipped)}"
    return ValueError(f"{problem}; {listed} (`grpokit recipes` lists them with what each does)")


def find_recipe(value: str, flag: str = "--config") -> str:
    """`value` if it is a file (or looks like inline YAML), else the path of the shipped recipe it names.
    Raises ValueError (unknown_recipe) for a value that is neither."""
    if Path(value).is_file() or any(c in value for c in ":{}[]\n"):
        return value
    if (path := shipped_recipe(value)) is None:
        raise unknown_recipe(value, f"{flag} {value}: no such file, and no shipped recipe of that name")
    return str(path)


def resolve_recipe_names(argv: list[str]) -> list[str]:
    """argv with each `--config` value that names a shipped recipe replaced by its file's path (see the
    module docstring); raises ValueError for a value that is neither a file nor a shipped recipe."""
    argv = list(argv)
    for at, name, value in _flag_positions(argv):
        if name in CONFIG_FLAGS and (path := find_recipe(value)) != value:
            argv[at] = path if argv[at] == value else f"{argv[at].split('=', 1)[0]}={path}"
    return argv
