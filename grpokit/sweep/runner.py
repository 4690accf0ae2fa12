"""Run a sweep: write each run's folder, launch the runs, record their state, resume an interrupted sweep.

Sweep folder layout:
```
{sweep_dir}/sweep.json                 the runs and their state (state.py)
{sweep_dir}/{run_id}/overrides.yaml    what this run changes (a recipe overlay: overrides, output_dir, run_name)
{sweep_dir}/{run_id}/resolved.yaml     the whole resolved recipe; the run is launched with it alone
{sweep_dir}/{run_id}/log.txt           the run's output, every attempt appended
{sweep_dir}/{run_id}/metrics.csv ...   what `grpokit fit` writes into a run folder
```
A run is launched as `grpokit fit --config resolved.yaml` (`grpokit train` when the sweep replays
recorded rollouts), plus `--ckpt.resume_step -1` when an earlier attempt left a checkpoint.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import yaml

from grpokit.cli.component_args import check_component_names
from grpokit.common.io import atomic_write_text
from grpokit.sweep.launchers import Launcher
from grpokit.sweep.recording import replay_problem, replay_transport
from grpokit.sweep.resolve import resolve_config
from grpokit.sweep.spec import RunSpec, SweepError, SweepSpec, nest
from grpokit.sweep.state import SweepState, asked_steps, definition, trained_steps
from grpokit.trainer.checkpoint import checkpoint_steps
from grpokit.transport.recorded import read_manifest

log = logging.getLogger(__name__)
POLL_INTERVAL = 0.2


class SweepRunner:
    """Prepares the run folders of `spec` under `sweep_dir` and runs every run that is not done."""

    def __init__(
        self, spec: SweepSpec, recipe_argv: list[str], sweep_dir: Path, launcher: Launcher, max_parallel: int
    ) -> None:
        self.spec, self.recipe_argv, self.launcher, self.max_parallel = spec, list(recipe_argv), launcher, max_parallel
        self.sweep_dir = sweep_dir.resolve()
        self.rollouts = spec.find(spec.rollouts, "rollouts") if spec.rollouts else None

    def prepare(self) -> SweepState:
        """sweep.json (new, or the interrupted sweep's) and every run's overrides.yaml and resolved.yaml."""
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        state = SweepState.open(
            self.sweep_dir / "sweep.json",
            definition(self.spec.runs, self.recipe_argv, str(self.rollouts) if self.rollouts else None),
        )
        manifest = read_manifest(self.rollouts, "rollouts") if self.rollouts else None
        for run in self.spec.runs:
            resolved = self.run_dir(run) / "resolved.yaml"
            if not resolved.is_file():  # kept from the first attempt: a resumed sweep runs what it started
                atomic_write_text(
                    self.run_dir(run) / "overrides.yaml", yaml.safe_dump(self.overlay(run), sort_keys=False)
                )
                recipe_argv = self.recipe_argv_of(run)
                try:  # a misspelt component on an axis: name the key and the known names, as `grpokit fit` does
                    check_component_names(["fit", *recipe_argv])
                except ValueError as e:
                    raise SweepError(f"run {run.id}: {e}") from None
                atomic_write_text(resolved, resolve_config(recipe_argv, run.id))
            if manifest is not None:
                self.check_replayable(run, yaml.safe_load(resolved.read_text()), len(manifest["sha256"]))
        return state

    def run_dir(self, run: RunSpec) -> Path:
        return self.sweep_dir / run.id

    def overlay(self, run: RunSpec) -> dict:
        """The recipe overlay of one run: its overrides, its folder, and the replay transport if any."""
        overrides = dict(run.overrides)
        if self.rollouts is not None:
            overrides["data.transport"] = replay_transport(self.rollouts)
        return {**nest(overrides), "output_dir": str(self.sweep_dir), "run_name": run.id}

    def recipe_argv_of(self, run: RunSpec) -> list[str]:
        overlays = [
            arg for path in run.overlays for arg in ("--config", str(self.spec.find(path, f"run {run.id}: config")))
        ]
        return [*self.recipe_argv, *overlays, "--config", str(self.run_dir(run) / "overrides.yaml")]

    def check_replayable(self, run: RunSpec, config: dict, recorded_steps: int) -> None:
        """A run on recorded rollouts may change the trainer's side only, and for at most the recorded steps."""
        problem = replay_problem(self.rollouts, config, recorded_steps)
        if problem:
            raise SweepError(f"run {run.id}: rollouts {self.rollouts}: {problem} (or drop rollouts:)")

    def command(self, run: RunSpec) -> tuple[list[str], int | None]:
        """The run's command line, and the checkpoint step it resumes from (None: from the start)."""
        role = "train" if self.rollouts is not None else "fit"
        command = [sys.executable, "-m", "grpokit", role, "--config", str(self.run_dir(run) / "resolved.yaml")]
        steps = checkpoint_steps(self.run_dir(run) / "checkpoints")
        return (command + ["--ckpt.resume_step", "-1"], steps[-1]) if steps else (command, None)

    def run(self) -> int:
        """Launch every run that is not done, at most max_parallel at a time; 0 when all are done."""
        state = self.prepare()
        self.recheck_done(state)
        todo = [run for run in self.spec.runs if state.runs[run.id].state != "done"]
        skipped = len(self.spec.runs) - len(todo)
        if skipped:
            log.info("sweep %s: %d of %d runs are done already", self.sweep_dir, skipped, len(self.spec.runs))
        active: dict[str, object] = {}
        while todo or active:
            while todo and len(active) < self.max_parallel:
                run = todo.pop(0)
                command, resumed_from = self.command(run)
                handle = self.launcher.start(command, self.run_dir(run) / "log.txt")
                state.mark_started(run.id, resumed_from, self.launcher.job_id(handle))
                active[run.id] = handle
                log.info(
                    "sweep: started %s%s",
                    run.id,
                    f" (resuming from step {resumed_from})" if resumed_from is not None else "",
                )
            for run_id, handle in list(active.items()):
                returncode = self.launcher.poll(handle)
                if returncode is not None:
                    del active[run_id]
                    self.record_end(state, run_id, returncode)
            time.sleep(POLL_INTERVAL)
        failed = [k for k, v in state.runs.items() if v.state != "done"]
        if failed:
            log.error(
                "sweep: %d run(s) failed or stopped early: %s; fix and run the same command again to "
                "retry them (each continues from its newest checkpoint)",
                len(failed),
                ", ".join(failed),
            )
        return 1 if failed else 0

    def record_end(self, state: SweepState, run_id: str, returncode: int) -> None:
        """Record an ended run as done, failed (a non-zero exit: an error, or a signal such as SIGTERM's
        143) or incomplete (exit 0 short of trainer.max_steps), and say which."""
        run_dir = self.sweep_dir / run_id
        outcome = state.mark_ended(run_id, returncode, run_dir)
        if outcome == "done":
            log.info("sweep: %s done", run_id)
        elif outcome == "failed":
            log.info("sweep: %s failed (exit %d, see %s)", run_id, returncode, run_dir / "log.txt")
        else:
            log.warning(
                "sweep: %s exited 0 after %d of %s steps: incomplete, not done (see %s)",
                run_id,
                trained_steps(run_dir),
                asked_steps(run_dir),
                run_dir / "log.txt",
            )

    def recheck_done(self, state: SweepState) -> None:
        """Runs marked done whose metrics.csv holds fewer steps than trainer.max_steps (a sweep folder of a
        grpokit that took a SIGTERM'd run's exit 0 for done) become incomplete, so they run again."""
        for run in self.spec.runs:
            saved = state.runs[run.id]
            asked, steps = asked_steps(self.run_dir(run)), trained_steps(self.run_dir(run))
            if saved.state == "done" and asked is not None and steps < asked:
                log.warning("sweep: %s was marked done with %d of %d steps: running it again", run.id, steps, asked)
                state.update(run.id, state="incomplete", steps=steps)
