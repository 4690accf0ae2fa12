"""Kill `grpokit fit` with SIGKILL mid-run, resume with ckpt.resume_step -1: no step lost or repeated."""

import json
from pathlib import Path

from grpokit.main import main
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics
from tests.support.processes import kill_after_checkpoint

MAX_STEPS = 12


def argv(tmp_path, tiny_model, name, *extra):
    return tiny_fit_argv(
        tmp_path, tiny_model, name, "--trainer.max_steps", str(MAX_STEPS), "--ckpt.interval", "2", *extra
    )


def prompts_per_step(run: Path) -> dict[int, list[int]]:
    """The example ids each step trained on (the last record of a step wins: a resumed step is redone)."""
    out: dict[int, list[int]] = {}
    for line in open(run / "samples.jsonl"):
        s = json.loads(line)
        out.setdefault(s["step"], [])
        out[s["step"]].append(s["example_id"])
    return out


def test_sigkill_then_resume_continues_without_gaps_or_repeats(tmp_path, tiny_model):
    run = tmp_path / "killed"
    kill_after_checkpoint(argv(tmp_path, tiny_model, "killed"), run / "checkpoints" / "step_4.ckpt")
    killed_at = max(int(p.stem[5:]) for p in (run / "checkpoints").glob("step_*.ckpt"))
    assert killed_at < MAX_STEPS

    assert main(argv(tmp_path, tiny_model, "killed", "--ckpt.resume_step", "-1")) == 0

    rows = read_metrics(run)
    assert [int(r["step"]) for r in rows] == list(range(MAX_STEPS))  # each step trained exactly once
    assert (run / "checkpoints" / f"step_{MAX_STEPS}.ckpt").exists()
    assert not list((run / "checkpoints").glob("*.tmp"))

    # the dataset position continues: the same prompts per step as an uninterrupted run
    assert main(argv(tmp_path, tiny_model, "straight")) == 0
    resumed, straight = prompts_per_step(run), prompts_per_step(tmp_path / "straight")
    assert sorted(resumed) == list(range(MAX_STEPS))
    assert all(sorted(set(resumed[s])) == sorted(set(straight[s])) for s in range(MAX_STEPS))


def test_resume_without_checkpoints_names_the_fix(tmp_path, tiny_model):
    import pytest

    with pytest.raises(FileNotFoundError, match="no checkpoints"):
        main(argv(tmp_path, tiny_model, "never-ran", "--ckpt.resume_step", "-1"))
