"""A CSV logger that keeps a resumed run's history: rows of steps before the resume step stay.

Every rewrite of metrics.csv (dropping the rows a resumed run redoes, or Lightning's rewrite when a new
column appears) goes to a temp file renamed over it, so a run killed mid-rewrite loses no earlier row.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from grpokit.common.io import atomic_write_text


class _AppendingWriter(ExperimentWriter):
    def __init__(self, log_dir: str, keep_before_step: int | None) -> None:
        self.keep_before_step = keep_before_step
        super().__init__(log_dir=log_dir)

    def _check_log_dir_exists(self) -> None:
        path = Path(self.metrics_file_path)
        if not path.is_file():
            return
        if self.keep_before_step is None:
            path.unlink()  # a fresh run in an old folder starts a fresh file
            return
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            fields, rows = (
                reader.fieldnames or [],
                [r for r in reader if r.get("step") and int(float(r["step"])) < self.keep_before_step],
            )
        self._write_rows(fields, rows)  # rows of steps the resumed run will redo are dropped
        self.metrics_keys = list(fields)

    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        with open(self.metrics_file_path, newline="") as f:
            rows = list(csv.DictReader(f))
        self._write_rows(fieldnames, rows)

    def _write_rows(self, fieldnames: list[str], rows: list[dict]) -> None:
        out = io.StringIO(newline="")
        writer = csv.DictWriter(out, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(self.metrics_file_path, out.getvalue())


class ResumableCSVLogger(CSVLogger):
    """CSVLogger writing `metrics.csv`; on resume it keeps the rows of steps before `resume_step`.

    Args:
        save_dir: the run folder.
        resume_step: the step training resumes at (None for a fresh run).
        flush_logs_every_n_steps: how often rows reach the disk.
    """

    def __init__(self, save_dir: str, resume_step: int | None = None, flush_logs_every_n_steps: int = 1) -> None:
        super().__init__(save_dir=save_dir, name="", version="", flush_logs_every_n_steps=flush_logs_every_n_steps)
        self.resume_step = resume_step

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(self.log_dir, self.resume_step)
        return self._experiment
