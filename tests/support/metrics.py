"""Reading a run's metrics.csv, as most tests of a run do: the rows of its trained steps."""

from __future__ import annotations

import csv
from pathlib import Path


def read_metrics(run_dir: str | Path, column: str | None = "loss") -> list[dict[str, str]]:
    """The rows of `run_dir`/metrics.csv that have a value in `column`, as csv.DictReader gives them
    (strings). The default, "loss", keeps one row per trained step: the CSV logger also writes rows
    of other metrics (evaluation, the rollout thread's) that have no loss. `column=None`: every row."""
    with open(Path(run_dir) / "metrics.csv", newline="") as f:
        return [row for row in csv.DictReader(f) if column is None or row.get(column)]
