"""`grpokit recipes`: the shipped recipes with what each does, and `grpokit recipes cp NAME DEST` to copy one
to edit. A recipe runs by name without copying (`grpokit fit --config reverse_text`: grpokit.cli.recipe_files)."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from grpokit.cli.recipe_files import shipped_recipe, shipped_recipes, unknown_recipe


def recipes_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="grpokit recipes",
        description="List the shipped recipes (the default), or copy one to edit. Any recipe command takes a "
        "shipped recipe by name: grpokit fit --config reverse_text --config ablations/gspo",
    )
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("list", help="each shipped recipe's name and the first line of its comment (the default)")
    cp = sub.add_parser("cp", help="copy a shipped recipe to a file or folder, to edit it")
    cp.add_argument("name", help="a shipped recipe's name, e.g. reverse_text or ablations/gspo")
    cp.add_argument("dest", help="the file to write, or a folder to copy it into under its own file name")
    cp.add_argument("--force", action="store_true", help="overwrite a file that exists")
    args = parser.parse_args(argv)
    if args.command == "cp":
        return copy_recipe(args.name, Path(args.dest), args.force)
    print(recipes_table(), end="")
    return 0


def recipes_table() -> str:
    """One line per shipped recipe: its name and the first line of its leading comment."""
    shipped = shipped_recipes()
    width = max(map(len, shipped), default=4)
    return "".join(f"{name:<{width}}  {first_comment_line(path)}\n" for name, path in shipped.items())


def first_comment_line(path: Path) -> str:
    """The text of a YAML file's first comment line ('' when it does not start with a comment)."""
    with open(path) as f:
        first = f.readline().strip()
    return first.lstrip("#").strip() if first.startswith("#") else ""


def copy_recipe(name: str, dest: Path, force: bool) -> int:
    """Copy the shipped recipe `name` to `dest` (a folder: under the recipe's file name). Refuses to
    overwrite a file unless `force`; returns the exit code."""
    source = shipped_recipe(name)
    if source is None:
        print(f"grpokit recipes: error: {unknown_recipe(name, f'no shipped recipe named {name}')}", file=sys.stderr)
        return 2
    target = dest / source.name if dest.is_dir() else dest
    if target.exists() and not force:
        print(f"grpokit recipes: error: {target} exists; add --force to overwrite it", file=sys.stderr)
        return 2
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    print(f"{target}  (edit it, and pass it to --config: after its base recipe if it is an overlay)")
    return 0
