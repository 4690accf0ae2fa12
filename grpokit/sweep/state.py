"""sweep.json: what a sweep is (its runs and recipe arguments) and where each run stands.

Written atomically after every change, by the sweep process only (never by a run), so a sweep killed at
any moment leaves a readable file. A run is `pending`, `running`, `done` (its process exited 0) or
`failed`; a resumed sweep skips `done` runs and launches the others again, each from its newest
checkpoint when it has one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpokit.common.io import atomic_write_json
from grpokit.sweep.spec import RunSpec, SweepError

FORMAT, VERSION = "grpokit.Sweep", 1


@dataclass
class RunState:
    """Where one run stands; `attempts` counts launches, `resumed_from` the checkpoint step of the last one."""

    state: str = "pending"
    attempts: int = 0
    returncode: int | None = None
    resumed_from: int | None = None
    job_id: str | None = None
    started: float | None = None
    ended: float | None = None


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

    def mark_ended(self, run_id: str, returncode: int) -> None:
        self.update(run_id, state="done" if returncode == 0 else "failed", returncode=returncode, ended=time.time())


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
