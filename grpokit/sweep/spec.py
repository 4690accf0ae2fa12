"""The sweep file: which runs a sweep has, and how they are launched.

```yaml
name: losses                 # the sweep folder is {output_dir}/{name} (default: this file's name)
output_dir: outputs          # default: outputs
axes:                        # a grid: every combination, the first axis varying slowest
  model.loss: [AIPO, ClippedPG, GSPO]          # any recipe key, dotted
  seed_everything: [0, 1]
runs:                        # and/or an explicit list; with axes too, each run is crossed with the grid
  - {model.lr: 1.0e-4, config: recipes/ablations/gspo.yaml}
max_parallel: 1              # runs at the same time (local launcher)
launcher: local              # or {name: submitit, timeout_min: 60, slurm_partition: gpu, ...}
rollouts: path/to/recorded   # optional: every run trains on these recorded batches (frozen rollouts)
```
The key `config` takes recipe overlay files (a path, a list of paths, or null for none), added as
`--config` after the recipe; relative paths (here and in `rollouts`) are looked up in the working
directory, then beside the sweep file. Overlays are the way to swap a class with tuned settings: the
shipped recipes/ablations/*.yaml restate every init_arg, a bare `model.loss: ClippedPG` takes the
class defaults.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SWEEP_KEYS = ("name", "output_dir", "axes", "runs", "max_parallel", "launcher", "rollouts")
SWEEP_NAME = re.compile(r"[A-Za-z0-9._=+-]{1,100}")  # one folder under output_dir, never a path out of it
RUNNER_KEYS = {"run_name", "output_dir"}  # set for each run by the runner
OVERLAY_KEY = "config"


class SweepError(ValueError):
    """A sweep file, sweep folder or run that cannot be used as it is; the message names the fix."""


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep.

    Attributes:
        id: its folder name under the sweep folder (index first, then what it sets).
        overrides: dotted recipe key -> value.
        overlays: recipe overlay files, applied after the recipe and before `overrides`.
    """

    id: str
    overrides: dict[str, Any]
    overlays: tuple[str, ...] = ()

    def as_json(self) -> dict:
        return {"id": self.id, "overrides": self.overrides, "overlays": list(self.overlays)}


@dataclass
class SweepSpec:
    """A parsed sweep file (see the module docstring)."""

    name: str
    runs: list[RunSpec]
    output_dir: str = "outputs"
    max_parallel: int = 1
    launcher: dict[str, Any] = field(default_factory=lambda: {"name": "local"})
    rollouts: str | None = None
    folder: Path = Path(
        "."
    )  # the sweep file's folder: relative paths are looked up here when not found in the working directory

    def find(self, path: str, key: str) -> Path:
        """A file or folder the sweep names (an overlay, the rollouts): from the working directory, else the
        sweep file's folder."""
        for candidate in (Path(path), self.folder / path):
            if candidate.exists():
                return candidate.resolve()
        raise SweepError(
            f"{key}: {path} exists neither in the working directory nor beside the sweep file ({self.folder})"
        )


def load_sweep(path: str | Path) -> SweepSpec:
    """Parse and check a sweep file; every error names the sweep key and the fix."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"--sweep {path}: no such file")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise SweepError(f"{path}: a sweep file is a mapping with keys {', '.join(SWEEP_KEYS)}")
    unknown = sorted(set(raw) - set(SWEEP_KEYS))
    if unknown:
        raise SweepError(
            f"{path}: unknown sweep key(s) {unknown}; a sweep file has "
            f"{', '.join(SWEEP_KEYS)} (recipe keys go under axes: or runs:)"
        )
    combos = expand(raw.get("axes"), raw.get("runs"), path)
    launcher = raw.get("launcher", "local")
    launcher = {"name": launcher} if isinstance(launcher, str) else dict(launcher or {})
    if "name" not in launcher:
        raise SweepError(f"{path}: launcher needs a name (local or submitit), got {launcher}")
    name = str(raw.get("name") or path.stem)
    if not SWEEP_NAME.fullmatch(name) or name in (".", ".."):
        raise SweepError(
            f"{path}: name {name[:120]!r} must be one plain folder name of at most 100 letters, digits and ._=+- "
            "(the sweep folder is {output_dir}/{name}); put a parent folder in output_dir"
        )
    runner_keys = sorted({k for c in combos for k in c} & RUNNER_KEYS)
    if runner_keys:
        raise SweepError(
            f"{path}: {runner_keys} cannot be an axis or a runs: key: the sweep sets each run's run_name (its id) "
            "and output_dir (the sweep folder); set the sweep's own output_dir or name instead"
        )
    max_parallel = raw.get("max_parallel", 1)
    if not isinstance(max_parallel, int) or max_parallel < 1:
        raise SweepError(f"{path}: max_parallel must be an integer >= 1, got {max_parallel!r}")
    return SweepSpec(
        name=name,
        runs=[make_run(i, c) for i, c in enumerate(combos)],
        output_dir=str(raw.get("output_dir", "outputs")),
        max_parallel=max_parallel,
        launcher=launcher,
        rollouts=None if raw.get("rollouts") is None else str(raw["rollouts"]),
        folder=path.parent,
    )


def expand(axes: Any, runs: Any, path: Path) -> list[dict[str, Any]]:
    """The settings of every run: the grid of `axes`, crossed with each entry of `runs` when both are given."""
    axes = axes or {}
    if not isinstance(axes, dict) or any(not isinstance(v, list) or not v for v in axes.values()):
        raise SweepError(
            f"{path}: axes maps each recipe key to a non-empty list of values, e.g. `model.lr: [1.0e-4, 3.0e-4]`"
        )
    if runs is not None and (not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs)):
        raise SweepError(f"{path}: runs is a list of mappings of recipe keys to values, e.g. `- {{model.lr: 1.0e-4}}`")
    grid = [dict(zip(axes, values)) for values in itertools.product(*axes.values())]
    if runs is None:
        if not axes:
            raise SweepError(f"{path}: no runs: give axes: (a grid) or runs: (a list), or both")
        return grid
    combos = []
    for run in runs or [{}]:
        for point in grid:
            shared = sorted(set(run) & set(point))
            if shared:
                raise SweepError(
                    f"{path}: key(s) {shared} are set both by axes: and by a runs: entry; set each key in one place"
                )
            combos.append({**run, **point})
    return combos


def make_run(index: int, settings: dict[str, Any]) -> RunSpec:
    overlays = settings.get(OVERLAY_KEY)
    overlays = () if overlays is None else (overlays,) if isinstance(overlays, str) else tuple(overlays)
    overrides = {k: v for k, v in settings.items() if k != OVERLAY_KEY}
    labels = [f"{label_key(k, overrides)}={label_value(v)}" for k, v in overrides.items()]
    labels = [
        *(Path(o).stem for o in overlays),
        *(["base"] if OVERLAY_KEY in settings and not overlays else []),
        *labels,
    ]
    slug = re.sub(r"[^A-Za-z0-9._=+-]+", "_", "-".join(labels))[:80] or "base"
    return RunSpec(id=f"{index:02d}-{slug}", overrides=overrides, overlays=overlays)


def label_key(key: str, overrides: dict[str, Any]) -> str:
    """The last part of a dotted key, or the whole key when another key ends the same way."""
    last = key.rsplit(".", 1)[-1]
    return last if sum(k.rsplit(".", 1)[-1] == last for k in overrides) == 1 else key


def label_value(value: Any) -> str:
    """A short name for a value: a class path's class name, a file's stem, or compact JSON."""
    if isinstance(value, dict) and "class_path" in value:
        return label_value(value["class_path"])
    if isinstance(value, str):
        return (
            value.rsplit(".", 1)[-1]
            if re.fullmatch(r"[\w.]+", value) and "." in value and not value[0].isdigit()
            else value
        )
    if isinstance(value, list):
        return "+".join(label_value(v) for v in value)
    return json.dumps(value, separators=(",", ":"))


def nest(overrides: dict[str, Any]) -> dict[str, Any]:
    """{"model.loss": X, "model.lr": y} -> {"model": {"loss": X, "lr": y}} (a recipe overlay)."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SweepError(
                    f"recipe key {key!r} sets inside {part!r}, which another key sets to a value; give that "
                    "key the whole value, e.g. `model.loss: {class_path: GSPO, init_args: {eps_low: 3.0e-4}}`"
                )
        node[last] = value
    return out


def is_seed_key(key: str) -> bool:
    """Seed keys (seed_everything, data.seed, data.sampling.seed): runs differing only in them are one variant."""
    return key.rsplit(".", 1)[-1].endswith("seed") or key == "seed_everything"
