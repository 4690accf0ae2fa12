"""Short recipe errors: the error line and a "did you mean", not argparse's ~100-line usage first.

jsonargparse prints the whole usage of `grpokit fit` (every option of the trainer, model, data, ...)
before a one-line error; the line that matters scrolls away. GrpoArgumentParser prints the error, a
suggestion for a misspelled key or init arg (difflib against the keys the parser or the component
accepts), and where the full option list is.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
import sys
from typing import NoReturn

from lightning.pytorch.cli import LightningArgumentParser

UNKNOWN_KEY = re.compile(r"does not accept option '([\w.]+)'")
UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)")
UNKNOWN_INIT_ARG = re.compile(r"class_path '([\w.]+)':\s*\n\s*Option '(\w+)' is not accepted")


class RecipeError(ValueError):
    """A recipe that does not parse: the parser's one-line message and its did-you-mean."""


class GrpoArgumentParser(LightningArgumentParser):
    """LightningArgumentParser whose errors are one line plus a suggestion, printed before exiting, or
    raised as RecipeError (`raise_errors`: grpokit.cli.parse_recipe); jsonargparse's debug mode
    (JSONARGPARSE_DEBUG=1: raise instead of exit) and parsers that do not exit on error keep its own."""

    # what the error names (not sys.argv[0]: `python -m grpokit.cli`, pytest); make_cli sets the role's
    command = "grpokit fit"
    raise_errors = False

    def __init__(self, *args, **kwargs) -> None:
        # no prefix matching: argparse would take `--trainer.max_step 5` as trainer.max_steps
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    @classmethod
    def for_command(cls, command: str, raise_errors: bool = False) -> type[GrpoArgumentParser]:
        return type(cls.__name__, (cls,), {"command": command, "raise_errors": raise_errors})

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG", "").lower() not in ("", "0", "false"):
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        if self.raise_errors:
            raise RecipeError(f"{message}{suggestion(message, parser)}") from ex
        sys.stderr.write(
            f"{self.command}: error: {message}{suggestion(message, parser)}\n(`{self.command} "
            "--help` lists every option)\n"
        )
        self.exit(2)


def suggestion(message: str, parser) -> str:
    """A "did you mean" for the misspelled key or init arg that `message` names, '' when there is none."""
    if match := UNKNOWN_INIT_ARG.search(message):
        class_path, name = match.groups()
        accepted = init_arg_names(class_path)
        return did_you_mean(name, accepted, f"\n{class_path.rsplit('.', 1)[-1]} accepts: {', '.join(sorted(accepted))}")
    keys = option_keys(parser)
    if match := UNKNOWN_KEY.search(message):
        return did_you_mean(match.group(1), keys)
    if match := UNRECOGNIZED.search(message):
        flags = [a.split("=")[0].lstrip("-") for a in match.group(1).split() if a.startswith("--")]
        return "".join(did_you_mean(f, keys, prefix="--") for f in flags)
    return ""


def did_you_mean(name: str, candidates: list[str], tail: str = "", prefix: str = "") -> str:
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.75)
    found = f"\ndid you mean {' or '.join(prefix + c for c in close)} (instead of {prefix}{name})?" if close else ""
    return found + tail


def option_keys(parser) -> list[str]:
    """Every dotted key the parser accepts (data.batch_size, model.lora.rank, ...)."""
    keys = {a.dest for a in parser._actions if a.dest and a.dest != "help"}
    try:
        keys |= set(parser.get_defaults().keys())
    except Exception:  # defaults that cannot be resolved here do not stop the error from printing
        pass
    return sorted(keys)


def init_arg_names(class_path: str) -> list[str]:
    """The init args a component class accepts: its __init__'s and, through **kwargs, its bases'."""
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return []
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass) or klass is object:
            continue
        params = inspect.signature(klass.__init__).parameters.values()
        names |= {p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return sorted(names)
