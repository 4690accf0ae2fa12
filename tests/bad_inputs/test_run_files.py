"""Batch files damaged between a run and its resume: a copied or renamed file holding another step's
batch, or a file cut short. The resumed `grpokit fit` trains the batches the killed run left on disk,
so each reaches the trainer, which refuses it with one line naming the file and the fix (exit 1), and
trains nothing on it.

Run through `grpokit.main.entry` (what the console script calls) on the tiny model.
"""

import shutil
from pathlib import Path

import pytest

from grpokit.main import entry
from grpokit.testing import tiny_fit_argv
from tests.support import read_metrics

TRANSPORT = ["--data.transport", '{"class_path": "FilesystemTransport", "init_args": {"keep_last": 0}}']


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory, tiny_model):
    """A finished 2-step run (checkpoint of step 2, batches of steps 0 and 1 kept)."""
    out = tmp_path_factory.mktemp("two-steps")
    argv = tiny_fit_argv(out, tiny_model, "run", "--trainer.max_steps", "2", "--ckpt.interval", "1", *TRANSPORT)
    assert entry(argv) == 0
    return out


def resumed(two_steps, tmp_path, tiny_model, damage) -> tuple[int, Path]:
    """Copy the 2-step run, `damage(its run folder)`, resume it to 3 steps: (exit code, run folder).
    Shared with tests/bad_inputs/test_damaged_files.py."""
    out = tmp_path / "out"
    shutil.copytree(two_steps, out)
    run = out / "run"
    damage(run)
    argv = tiny_fit_argv(
        out, tiny_model, "run", "--trainer.max_steps", "3", "--ckpt.interval", "1", "--ckpt.resume_step", "-1"
    )
    return entry([*argv, *TRANSPORT]), run


def trained_steps(run) -> list[int]:
    return [int(r["step"]) for r in read_metrics(run)]


def test_a_batch_file_holding_another_steps_batch_stops_the_resume(two_steps, tmp_path, tiny_model, capsys):
    # before: step 2 trained step 0's batch again and rc was 0
    code, run = resumed(
        two_steps,
        tmp_path,
        tiny_model,
        lambda run: shutil.copy(run / "rollouts" / "step_0.safetensors", run / "rollouts" / "step_2.safetensors"),
    )
    err = capsys.readouterr().err
    assert code == 1, err[-3000:]
    assert "Traceback" not in err
    assert "rollouts/step_2.safetensors holds the batch of step 0, not of step 2" in err
    assert "remove it and resume the run" in err
    assert trained_steps(run) == [0, 1]


def test_a_truncated_batch_file_stops_the_resume_naming_its_path(two_steps, tmp_path, tiny_model, capsys):
    def truncate(run):
        rollouts = run / "rollouts"
        data = (rollouts / "step_1.safetensors").read_bytes()
        (rollouts / "step_2.safetensors").write_bytes(data[: len(data) // 2])

    code, run = resumed(two_steps, tmp_path, tiny_model, truncate)
    err = capsys.readouterr().err
    assert code == 1, err[-3000:]
    assert "Traceback" not in err
    assert "batch file " in err and "rollouts/step_2.safetensors" in err
    assert trained_steps(run) == [0, 1]
