"""sweep.json: what a sweep is (its runs and recipe arguments) and where each run stands.

Written atomically after every change, by the sweep process only (never by a run), so a sweep killed at
any moment leaves a readable file. A run is `pending`, `running`, `done` (its process exited 0 having
trained every step it was asked for), `incomplete` (it exited 0 short of them, as a SIGTERM'd `grpokit
fit` did before it exited 143) or `failed` (it exited non-zero: an error, or a signal, 143 for SIGTERM);
a resumed sweep skips `done` runs, after checking their metrics.csv again, and launches the others
again, each from its newest checkpoint when it has one.
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpokit.common.io import atomic_write_json
from grpokit.sweep.spec import RunSpec, SweepError

FORMAT, VERSION = "grpokit.Sweep", 1


@dataclass
class RunState:
    """Where one run stands; `attempts` counts launches, `resumed_from` the checkpoint step of the last one,
    `steps` the steps its metrics.csv held when it last ended."""

    state: str = "pending"
    attempts: int = 0
    returncode: int | None = None
    resumed_from: int | None = None
    job_id: str | None = None
    started: float | None = None
    ended: float | None = None
    steps: int | None = None


@dataclass
class SweepState:
    """The contents of sweep.json."""

    path: Path
    definition: dict[str, Any]
    runs: dict[str, RunState] = field(default_factory=dict)

    @classmethod
    def open(cls, path: Path, definition: dict[str, Any]) -> SweepState:
        """Load sweep.json if it exists (it must describe the same sweep), else start a new one."""
        if not path.is_file():
            state = cls(path, definition, {run["id"]: RunState() for run in definition["runs"]})
            state.save()
            return state
        saved = json.loads(path.read_text())
        if saved.get("format") != FORMAT:
            raise SweepError(f"{path} is not a grpokit sweep state file")
        if saved["definition"] != definition:
            raise SweepError(
                f"{path.parent} holds a different sweep ({describe_change(saved['definition'], definition)}); "
                "give this sweep another name: or --sweep_dir, or delete the folder"
            )
        return cls(path, definition, {k: RunState(**v) for k, v in saved["runs"].items()})

    def save(self) -> None:
        runs = {k: vars(v) for k, v in self.runs.items()}
        atomic_write_json(
            self.path, {"format": FORMAT, "version": VERSION, "definition": self.definition, "runs": runs}
        )

    def update(self, run_id: str, **changes: Any) -> None:
        for key, value in changes.items():
            setattr(self.runs[run_id], key, value)
        self.save()

    def mark_started(self, run_id: str, resumed_from: int | None, job_id: str | None) -> None:
        run = self.runs[run_id]
        self.update(
            run_id,
            state="running",
            attempts=run.attempts + 1,
            resumed_from=resumed_from,
            job_id=job_id,
            started=time.time(),
            ended=None,
            returncode=None,
        )

    def mark_ended(self, run_id: str, returncode: int, run_dir: Path) -> str:
        """Record how the run in `run_dir` ended; its new state (`run_outcome`)."""
        steps = trained_steps(run_dir)
        state = run_outcome(returncode, steps, asked_steps(run_dir))
        self.update(run_id, state=state, returncode=returncode, ended=time.time(), steps=steps)
        return state


def run_outcome(returncode: int | None, steps: int, asked: int | None) -> str:
    """`done` only for a run that exited 0 having trained every step asked (`asked` None: not known
    before the run, trainer.max_steps -1); `failed` for a non-zero exit, `incomplete` for a run that
    exited 0 short of its steps. Neither is skipped by a resumed sweep or averaged by the report."""
    if returncode != 0:
        return "failed"
    return "incomplete" if asked is not None and steps < asked else "done"


def trained_steps(run_dir: Path) -> int:
    """The steps a run trained: the distinct steps of its metrics.csv rows with a loss (0 without one).
    A resumed run's file keeps the earlier attempts' rows before its checkpoint and drops the later ones."""
    try:
        with open(run_dir / "metrics.csv", newline="") as f:
            return len({r["step"] for r in csv.DictReader(f) if r.get("step") and r.get("loss")})
    except (OSError, csv.Error, KeyError):
        return 0


def asked_steps(run_dir: Path) -> int | None:
    """trainer.max_steps of the run's resolved.yaml; None when it is not a count (-1: one pass over the
    data, counted when the run starts) or the file is missing."""
    try:
        steps = (yaml.safe_load((run_dir / "resolved.yaml").read_text()) or {}).get("trainer", {}).get("max_steps")
    except (OSError, yaml.YAMLError):
        return None
    return steps if isinstance(steps, int) and steps > 0 else None


def describe_run(run: dict[str, Any], run_dir: Path) -> str:
    """`failed (exit 143)`, `incomplete` or `done`, with the steps trained of those asked: the report's
    words for a run (`run`: its sweep.json entry)."""
    asked, steps = asked_steps(run_dir), trained_steps(run_dir)
    state = run["state"]
    if state == "done" and run_outcome(0, steps, asked) != "done":
        state = "incomplete"  # marked done by a grpokit that took a SIGTERM'd run's exit 0 for done
    if state == "failed" and run.get("returncode") is not None:
        state = f"failed (exit {run['returncode']})"
    return f"{state}, {steps} of {asked} steps" if asked is not None else f"{state}, {steps} steps"


def definition(runs: list[RunSpec], recipe_argv: list[str], rollouts: str | None) -> dict[str, Any]:
    """What makes two sweeps the same sweep: the runs, the recipe arguments and the recorded rollouts."""
    return {"recipe_argv": list(recipe_argv), "rollouts": rollouts, "runs": [r.as_json() for r in runs]}


def describe_change(old: dict[str, Any], new: dict[str, Any]) -> str:
    if old.get("recipe_argv") != new.get("recipe_argv"):
        return f"recipe arguments were {old.get('recipe_argv')}, now {new.get('recipe_argv')}"
    if old.get("rollouts") != new.get("rollouts"):
        return f"rollouts was {old.get('rollouts')}, now {new.get('rollouts')}"
    old_ids, new_ids = [r["id"] for r in old["runs"]], [r["id"] for r in new["runs"]]
    return f"runs were {old_ids}, now {new_ids}" if old_ids != new_ids else "the settings of some runs changed"
