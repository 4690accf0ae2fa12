"""The golden run of the layout move: 10 steps of a tiny random model, synchronous (max_async_level 0),
seed 0. `python tests/golden/tiny_fit.py OUT.json` writes its per-step rewards and losses;
tests/test_golden_fit.py runs the same and compares with tiny_fit_10_steps.json, which was written by
the code before the package was regrouped (so a move that changes behaviour fails)."""

from __future__ import annotations

import csv
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS = 10
KEYS = ("reward", "loss", "grad_norm", "tokens", "kl")


def build_tiny_model(path: Path) -> str:
    """The suite's tiny model (grpokit.testing.build_tiny_model, as tests/conftest.py builds it)."""
    from grpokit.testing import build_tiny_model as build

    return str(build(path))


def run(output_dir: Path, model: str) -> dict[str, list[float]]:
    """Per-step values of KEYS from a 10-step synchronous tiny fit."""
    from grpokit.cli.discovery import discover
    from grpokit.main import main
    from grpokit.testing import tiny_fit_argv

    discover()
    argv = tiny_fit_argv(
        output_dir, model, "golden", "--model.lr", "1e-3", "--trainer.max_steps", str(STEPS),
        "--data.max_async_level", "0", "--ckpt.interval", "0",
    )  # fmt: skip
    assert main(argv) == 0
    rows = [r for r in csv.DictReader(open(output_dir / "golden" / "metrics.csv")) if r.get("loss")]
    return {key: [float(r[key]) for r in rows] for key in KEYS}


if __name__ == "__main__":
    import torch

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        values = run(Path(tmp), build_tiny_model(Path(tmp) / "tiny"))
    Path(sys.argv[1]).write_text(json.dumps(values, indent=1) + "\n")
    print(json.dumps(values))
