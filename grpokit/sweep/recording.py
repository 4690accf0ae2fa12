"""`grpokit rollouts record | replay`: keep a run's training batches, then train variants on them.

    grpokit rollouts record DIR --config recipe.yaml [recipe arguments]      # a normal fit; keeps every batch
    grpokit rollouts replay DIR --config recipe.yaml --run_name R [...]      # train on DIR, no sampling

Recording is an ordinary `grpokit fit` whose filesystem transport keeps every batch file (keep_last 0);
its batches, config.yaml and a manifest of sha256 checksums are then copied to DIR. Replaying is
`grpokit train` (the trainer role, no engine, no orchestrator) with the RecordedRollouts transport.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import yaml

from grpokit.cli import make_cli
from grpokit.common.io import atomic_write_bytes, atomic_write_json
from grpokit.sweep.resolve import resolve_config
from grpokit.transport.recorded import FORMAT, MANIFEST, VERSION, batch_file, read_manifest

KEEP_EVERY_BATCH = json.dumps(
    {"class_path": "grpokit.transport.filesystem.FilesystemTransport", "init_args": {"keep_last": 0}}
)
# replay ignores these data keys: they do not shape the recorded batches
DATA_KEYS_NOT_RECORDED = ("transport", "timeout", "eval", "num_logged_samples")


def replay_transport(folder: str | Path) -> dict:
    """The `data.transport` value that replays the recorded batches in `folder`."""
    return {
        "class_path": "grpokit.transport.recorded.RecordedRollouts",
        "init_args": {"path": str(Path(folder).resolve())},
    }


def record(dest: Path, recipe_argv: list[str]) -> Path:
    """Run `grpokit fit recipe_argv` keeping every batch, then copy the batches to `dest`."""

    cli = make_cli(["fit", *recipe_argv, "--data.transport", KEEP_EVERY_BATCH])
    return export(cli.run.run_dir, dest, int(cli.trainer.max_steps))


def export(run_dir: Path, dest: Path, num_steps: int) -> Path:
    """Copy batches 0..num_steps-1 of `run_dir` (and its config.yaml) to `dest` with a checksum manifest."""
    missing = [s for s in range(num_steps) if not batch_file(run_dir / "rollouts", s).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{run_dir}/rollouts lacks the batches of steps {missing[:5]}...: the run "
            "must keep every batch (data.transport FilesystemTransport with keep_last: 0)"
        )
    dest.mkdir(parents=True, exist_ok=True)
    checksums = {}
    for step in range(num_steps):
        data = batch_file(run_dir / "rollouts", step).read_bytes()
        atomic_write_bytes(batch_file(dest, step), data)
        checksums[str(step)] = hashlib.sha256(data).hexdigest()
    shutil.copyfile(run_dir / "config.yaml", dest / "config.yaml")
    atomic_write_json(
        dest / MANIFEST,
        {"format": FORMAT, "version": VERSION, "source_run": str(run_dir.resolve()), "sha256": checksums},
    )
    return dest


def replay(folder: Path, recipe_argv: list[str]):
    """Train on the recorded batches in `folder`: `grpokit train` with the RecordedRollouts transport, after
    checking that the recipe keeps the recording's data section and asks for at most the recorded steps."""

    argv = [*recipe_argv, "--data.transport", json.dumps(replay_transport(folder))]
    recorded_steps = len(read_manifest(folder)["sha256"])
    problem = replay_problem(folder, yaml.safe_load(resolve_config(argv, "replay")) or {}, recorded_steps)
    if problem:
        raise ValueError(f"grpokit rollouts replay {folder}: {problem}")
    return make_cli(["fit", *argv], role="train")


def replay_problem(folder: Path, config: dict, recorded_steps: int) -> str | None:
    """Why a run with resolved `config` cannot train on the recording in `folder` (None: it can). Recorded
    batches fix everything the data section shapes (environment, sampling, advantages, filters), so a run
    may change trainer-side keys only, for at most the recorded steps."""
    differences = data_differences(recorded_config(folder), config)
    if differences:
        return (
            f"the recorded rollouts fix the data section, but this run changes {'; '.join(differences)}. "
            "Vary trainer-side keys (model.*, trainer.*, seed_everything) on recorded rollouts, or record new ones"
        )
    max_steps = (config.get("trainer") or {}).get("max_steps")
    if max_steps is None or max_steps < 0 or max_steps > recorded_steps:
        return (
            f"trainer.max_steps={max_steps}, but {folder} holds "
            f"{recorded_steps} steps; set trainer.max_steps <= {recorded_steps}"
        )
    return None


def data_differences(recorded_config: dict, run_config: dict) -> list[str]:
    """`data.KEY` entries where a run's data section differs from the recording's (they would be ignored)."""
    recorded, run = recorded_config.get("data") or {}, run_config.get("data") or {}
    keys = sorted((set(recorded) | set(run)) - set(DATA_KEYS_NOT_RECORDED))
    return [
        f"data.{k}: recorded {recorded.get(k)!r}, this run {run.get(k)!r}"
        for k in keys
        if recorded.get(k) != run.get(k)
    ]


def recorded_config(folder: Path) -> dict:
    return yaml.safe_load((folder / "config.yaml").read_text()) or {}
