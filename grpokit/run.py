"""The state of one `grpokit` start, shared by the command (grpokit.main) and the recipe CLI.

`Startup` replaces two module-level globals: whether the recipe is parsed, built and wired (errors
before that are a bad value or a missing file, printed as one line; errors after it are training
failures and keep their traceback), and the run folder this start created (removed again when the
start fails before writing a file).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Startup:
    """How far one start got; grpokit.main.entry reads it when an error reaches it."""

    started: bool = False
    created_run_dir: Path | None = None
