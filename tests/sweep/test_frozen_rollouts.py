"""Frozen-rollout ablation: record a tiny-model run's batches, then train two losses on them.

Both variants must receive byte-identical batches (the sha256 of every batch each one trained on equals
the recording's), sample nothing, and still train differently (their losses differ).
"""

import json
from pathlib import Path

import pytest
import yaml

from grpokit.main import main
from grpokit.sweep.launchers import LocalLauncher
from grpokit.sweep.resolve import resolve_config
from grpokit.sweep.runner import SweepRunner
from grpokit.sweep.spec import SweepError, load_sweep
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics

REPO = Path(__file__).resolve().parents[2]
STEPS = 3


def recipe_args(tmp_path, tiny_model) -> list[str]:
    """The tiny-model recipe arguments (without `fit`, --output_dir and --run_name, which each use sets)."""
    argv = tiny_fit_argv(
        tmp_path, tiny_model, "unused", "--trainer.max_steps", str(STEPS), "--data.eval", "null", "--ckpt.interval", "0"
    )
    drop = {i for i, a in enumerate(argv) if a in ("--output_dir", "--run_name")}
    return [a for i, a in enumerate(argv[1:], 1) if i not in drop and i - 1 not in drop]


def test_two_losses_train_on_byte_identical_recorded_batches(tmp_path, tiny_model):
    recorded = tmp_path / "recorded"
    args = [*recipe_args(tmp_path, tiny_model), "--output_dir", str(tmp_path)]
    assert main(["rollouts", "record", str(recorded), *args, "--run_name", "recording"]) == 0
    manifest = json.loads((recorded / "manifest.json").read_text())
    assert sorted(manifest["sha256"], key=int) == [str(s) for s in range(STEPS)]

    assert main(["rollouts", "replay", str(recorded), *args, "--run_name", "aipo"]) == 0
    assert (
        main(
            [
                "rollouts",
                "replay",
                str(recorded),
                *args,
                "--config",
                str(REPO / "recipes" / "ablations" / "clipped_pg.yaml"),
                "--run_name",
                "clipped",
            ]
        )
        == 0
    )

    aipo, clipped = tmp_path / "aipo", tmp_path / "clipped"
    expected = [{"step": s, "sha256": manifest["sha256"][str(s)]} for s in range(STEPS)]
    for run in (aipo, clipped):
        assert [json.loads(line) for line in open(run / "replayed.jsonl")] == expected  # identical bytes, every step
        assert not (run / "samples.jsonl").exists()  # nothing was sampled
    recording, a, c = read_metrics(tmp_path / "recording"), read_metrics(aipo), read_metrics(clipped)
    assert [r["reward"] for r in a] == [r["reward"] for r in c] == [r["reward"] for r in recording]
    assert [r["loss"] for r in a] != [r["loss"] for r in c]  # the variants really differ
    assert "masked_frac" in a[0] and "clip_high_frac" in c[0]


def test_a_frozen_rollout_sweep_trains_with_the_replay_transport(tmp_path, tiny_model):
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    (recorded / "manifest.json").write_text(
        json.dumps({"format": "grpokit.RecordedRollouts", "version": 1, "sha256": {"0": "x", "1": "y", "2": "z"}})
    )
    args = recipe_args(tmp_path, tiny_model)
    (recorded / "config.yaml").write_text(resolve_config(args, "recording"))
    sweep = tmp_path / "frozen.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "rollouts": str(recorded),
                "axes": {"config": [None, str(REPO / "recipes" / "ablations" / "clipped_pg.yaml")]},
            }
        )
    )
    runner = SweepRunner(load_sweep(sweep), args, tmp_path / "sweep", LocalLauncher(), 1)
    runner.prepare()
    for run in runner.spec.runs:
        assert runner.command(run)[0][-4:] == [
            "grpokit",
            "train",
            "--config",
            str(runner.run_dir(run) / "resolved.yaml"),
        ]
        transport = yaml.safe_load((runner.run_dir(run) / "resolved.yaml").read_text())["data"]["transport"]
        assert transport == {
            "class_path": "grpokit.transport.recorded.RecordedRollouts",
            "init_args": {"path": str(recorded)},
        }


def test_a_frozen_rollout_sweep_refuses_data_changes_and_extra_steps(tmp_path, tiny_model):
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    (recorded / "manifest.json").write_text(
        json.dumps({"format": "grpokit.RecordedRollouts", "version": 1, "sha256": {"0": "x", "1": "y", "2": "z"}})
    )
    args = recipe_args(tmp_path, tiny_model)
    (recorded / "config.yaml").write_text(resolve_config(args, "recording"))
    for axes, message in (
        (
            {"data.advantage": ["GroupNorm", "LeaveOneOut"]},
            r"01-advantage=LeaveOneOut: .* changes data.advantage: recorded",
        ),
        ({"trainer.max_steps": [4]}, r"set trainer.max_steps <= 3"),
    ):
        sweep = tmp_path / "bad.yaml"
        sweep.write_text(yaml.safe_dump({"rollouts": str(recorded), "axes": axes}))
        runner = SweepRunner(load_sweep(sweep), args, tmp_path / f"bad-{len(message)}", LocalLauncher(), 1)
        with pytest.raises(SweepError, match=message):
            runner.prepare()
        assert not list(runner.sweep_dir.glob("*/log.txt"))  # refused before any run started


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["--data.advantage", "LeaveOneOut"],
            r"rollouts replay .*: the recorded rollouts fix the data "
            r"section, but this run changes data.advantage: recorded",
        ),
        (["--trainer.max_steps", "4"], r"trainer.max_steps=4, but .* holds 3 steps; set trainer.max_steps <= 3"),
    ],
    ids=["data overlay", "more steps than recorded"],
)
def test_replay_refuses_data_changes_and_extra_steps_before_training(tmp_path, tiny_model, overrides, message):
    """`grpokit rollouts replay` applies the sweep's rules: a data overlay (an advantage, a filter) would be
    silently ignored (the batches carry the recording's advantages), so it is an error, as is asking for more
    steps than were recorded; both are refused before anything trains."""
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    (recorded / "manifest.json").write_text(
        json.dumps({"format": "grpokit.RecordedRollouts", "version": 1, "sha256": {"0": "x", "1": "y", "2": "z"}})
    )
    args = recipe_args(tmp_path, tiny_model)
    (recorded / "config.yaml").write_text(resolve_config(args, "recording"))
    with pytest.raises(ValueError, match=message):
        main(
            [
                "rollouts",
                "replay",
                str(recorded),
                *args,
                "--output_dir",
                str(tmp_path),
                "--run_name",
                "variant",
                *overrides,
            ]
        )
    assert not (tmp_path / "variant").exists()
