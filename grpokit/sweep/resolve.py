"""A run's resolved recipe: the recipe, overlays and overrides parsed by `grpokit fit --print_config`.

Every run of a sweep is resolved before any run starts, so a misspelt key or a wrong value fails the
sweep at once with jsonargparse's message (naming the key) instead of failing run 3 an hour later. The
resolved file is what the run is launched with, so a resumed sweep runs exactly what it started even if
the recipe file was edited in between.
"""

from __future__ import annotations

import io
import warnings
from contextlib import redirect_stderr, redirect_stdout

from grpokit.sweep.spec import SweepError


def resolve_config(recipe_argv: list[str], run_label: str) -> str:
    """The resolved recipe (YAML) for `grpokit fit` arguments `recipe_argv`, without building anything."""
    from grpokit.cli import make_cli

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err), warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="LightningCLI's args parameter"
        )  # the sweep's own sys.argv is not the run's
        try:
            make_cli(["fit", *recipe_argv, "--print_config"])
        except SystemExit as e:
            if e.code not in (0, None):
                raise SweepError(
                    f"run {run_label}: the recipe does not parse with this "
                    f"run's settings:\n{err.getvalue().strip()[-2000:]}"
                ) from None
            return out.getvalue()
    raise SweepError(f"run {run_label}: --print_config did not stop the CLI (grpokit fit {' '.join(recipe_argv)})")
